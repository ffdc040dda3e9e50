//! OCI images to Sandcell root images.
//!
//! An image comes from a registry ([`registry::pull`]), an OCI layout directory or a
//! `docker save` tarball ([`import::import`]). Either way its blobs land in the
//! [`cache::BlobCache`] (by digest, verified), and [`build::build`] unpacks the layers in
//! order ([`unpack`]: whiteouts, opaque directories, owners, modes, xattrs, hard links; path
//! traversal, symlink escapes and oversized or bomb layers refused), adds the agent and
//! makes what the runtimes expect:
//!
//! ```text
//! <data-dir>/images/<name>/rootfs/       the tree (gVisor uses it read-only under an overlay)
//! <data-dir>/images/<name>/rootfs.ext4   the same tree as ext4 (microVMs), `mkfs.ext4 -d`
//! <data-dir>/images/<name>/config.json   sandcell_proto::image::ImageDefaults
//! ```

pub mod build;
pub mod cache;
pub mod diff;
pub mod digest;
pub mod dockerfile;
mod documents;
mod guard;
pub mod import;
pub mod progress;
pub mod registry;
pub mod spec;
pub mod store;
pub mod template;
pub mod unpack;

pub use build::{BuildOptions, BuildReport, build};
pub use progress::{Event, NoProgress, Progress};
pub use sandcell_proto::image::{IMAGE_CONFIG_FILE, ImageDefaults};
pub use spec::ResolvedImage;

use std::path::PathBuf;

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{what} {}: {source}", path.display())]
    Io {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("invalid image reference {reference:?}: {problem}")]
    Reference { reference: String, problem: String },
    /// oci-client's message, bounded and printable: it may carry a registry's error body.
    /// No longer made by a pull (the token exchange is ours: [`Error::Token`]); kept for
    /// the callers that match on it.
    #[error("registry, {reference}{}", documents::excerpt(source.to_string().as_bytes()))]
    Registry {
        reference: String,
        #[source]
        source: Box<oci_client::errors::OciDistributionError>,
    },
    /// A registry's error status for a manifest; `excerpt` is a short printable part of
    /// its body (`: ...`) or empty.
    #[error("registry, {url}: {status}{excerpt}")]
    RegistryStatus {
        url: String,
        status: reqwest::StatusCode,
        excerpt: String,
    },
    #[error("{what}: {source}")]
    Http {
        what: String,
        #[source]
        source: reqwest::Error,
    },
    /// The bearer-token exchange with a registry's token realm failed: what went wrong, with
    /// at most a short printable excerpt of what the realm said.
    #[error("registry {registry}: bearer token: {problem}")]
    Token { registry: String, problem: String },
    /// A token realm's answer past the cap: a token is a few KiB.
    #[error(
        "registry {registry}: bearer token: the answer of the token realm {realm} is larger \
         than {limit} bytes, refused (a token is a few KiB)"
    )]
    TokenTooLarge {
        registry: String,
        realm: String,
        limit: u64,
    },
    /// A manifest, index or image config past the cap: a registry's documents are small.
    #[error("{what}: larger than {limit} bytes, refused (a manifest or image config is a few KiB)")]
    DocumentTooLarge { what: String, limit: u64 },
    /// The pull's guard refused a connection (a redirect or token realm at an internal
    /// address, or plain HTTP to a registry the operator did not list).
    #[error("pulling {reference}: {why}")]
    PullRefused { reference: String, why: String },
    #[error("invalid digest {0:?} (expected sha256:<64 hex digits>)")]
    BadDigest(String),
    #[error("{what}: content has digest {actual}, expected {expected}")]
    DigestMismatch {
        what: String,
        expected: String,
        actual: String,
    },
    #[error("{what}: {problem}")]
    Manifest { what: String, problem: String },
    #[error("layer {layer}: unsafe path {path:?}: {problem}")]
    UnsafePath {
        layer: String,
        path: String,
        problem: &'static str,
    },
    #[error("layer {layer}: {what} exceeds the limit of {limit} {unit}")]
    TooLarge {
        layer: String,
        what: String,
        limit: u64,
        unit: &'static str,
    },
    #[error("layer {layer}: entry {path:?}: {problem}")]
    BadEntry {
        layer: String,
        path: String,
        problem: String,
    },
    #[error("{tool}: {problem}")]
    Tool { tool: &'static str, problem: String },
    #[error(
        "invalid image name {0:?}: lowercase letters, digits, '-', '_' and '.', not starting with '.' or '-'"
    )]
    InvalidName(String),
    #[error("image {0:?} not found")]
    NotFound(String),
    #[error("image {0:?} already exists (use --force to replace it)")]
    Exists(String),
    #[error(
        "image {name:?} is in use (sandboxes made from it: {}); stop them first",
        users.join(", ")
    )]
    InUse { name: String, users: Vec<String> },
    #[error(transparent)]
    Dockerfile(#[from] dockerfile::ParseError),
    #[error("Dockerfile line {line}: {step}: exit status {code}\n{output}")]
    StepFailed {
        line: usize,
        step: String,
        code: i32,
        /// The end of its output.
        output: String,
    },
    #[error("agent {}: {problem}", path.display())]
    Agent { path: PathBuf, problem: String },
}

impl Error {
    pub(crate) fn io(
        what: &'static str,
        path: impl Into<PathBuf>,
    ) -> impl FnOnce(std::io::Error) -> Error {
        let path = path.into();
        move |source| Error::Io { what, path, source }
    }
}

/// Bounds on what a layer or an image may hold: past them the import fails with
/// [`Error::TooLarge`] instead of filling the disk (decompression bombs included: the
/// uncompressed stream is counted as it is read, whatever the headers claim).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// A compressed blob (layer or config) as downloaded or imported.
    pub max_blob_bytes: u64,
    /// A layer's uncompressed tar stream.
    pub max_layer_bytes: u64,
    /// All layers' uncompressed streams together.
    pub max_image_bytes: u64,
    /// One file's size.
    pub max_file_bytes: u64,
    /// Entries in all layers together.
    pub max_entries: u64,
    /// A manifest, index or config document.
    pub max_document_bytes: u64,
}

impl Default for Limits {
    fn default() -> Limits {
        const GIB: u64 = 1 << 30;
        Limits {
            max_blob_bytes: 16 * GIB,
            max_layer_bytes: 32 * GIB,
            max_image_bytes: 64 * GIB,
            max_file_bytes: 16 * GIB,
            max_entries: 4_000_000,
            max_document_bytes: 4 << 20,
        }
    }
}

/// Image names: what `Image::resolve` and the daemon accept as a template id, lowercase.
pub fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 128
        && !name.starts_with(['.', '-'])
        && name.bytes().all(|b| {
            b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'-' | b'_' | b'.')
        })
}
