//! The few OCI (and Docker v2) document fields Sandcell reads, and [`ResolvedImage`]: an
//! image whose blobs are all in the cache, ready to build.

use crate::digest::Digest;
use crate::{Error, Result};
use sandcell_proto::image::ImageDefaults;
use serde::Deserialize;

pub const MEDIA_OCI_INDEX: &str = "application/vnd.oci.image.index.v1+json";
pub const MEDIA_DOCKER_LIST: &str = "application/vnd.docker.distribution.manifest.list.v2+json";

/// A descriptor: what a manifest or index points at.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Descriptor {
    #[serde(default)]
    pub media_type: String,
    pub digest: String,
    #[serde(default)]
    pub size: u64,
    #[serde(default)]
    pub platform: Option<Platform>,
    #[serde(default)]
    pub annotations: Option<std::collections::BTreeMap<String, String>>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct Platform {
    #[serde(default)]
    pub os: String,
    #[serde(default)]
    pub architecture: String,
}

/// An image index or manifest: the two are told apart by `mediaType` or by which of
/// `manifests`/`layers` they have.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Document {
    #[serde(default)]
    pub media_type: Option<String>,
    #[serde(default)]
    pub manifests: Option<Vec<Descriptor>>,
    #[serde(default)]
    pub config: Option<Descriptor>,
    #[serde(default)]
    pub layers: Option<Vec<Descriptor>>,
}

impl Document {
    pub fn parse(bytes: &[u8], what: &str) -> Result<Document> {
        serde_json::from_slice(bytes).map_err(|e| Error::Manifest {
            what: what.into(),
            problem: format!("not a valid OCI manifest or index: {e}"),
        })
    }

    pub fn is_index(&self) -> bool {
        matches!(
            self.media_type.as_deref(),
            Some(MEDIA_OCI_INDEX | MEDIA_DOCKER_LIST)
        ) || (self.manifests.is_some() && self.layers.is_none())
    }
}

/// The platform Sandcell runs: the first linux/amd64 entry of an index.
pub fn pick_linux_amd64<'a>(entries: &'a [Descriptor], what: &str) -> Result<&'a Descriptor> {
    entries
        .iter()
        .find(|d| {
            d.platform
                .as_ref()
                .is_some_and(|p| p.os == "linux" && p.architecture == "amd64")
        })
        .ok_or_else(|| Error::Manifest {
            what: what.into(),
            problem: format!(
                "the index has no linux/amd64 image (it has: {})",
                entries
                    .iter()
                    .map(|d| d
                        .platform
                        .as_ref()
                        .map_or("unknown".to_string(), |p| format!(
                            "{}/{}",
                            p.os, p.architecture
                        )))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        })
}

/// The image config's fields we use.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct ImageConfigFile {
    #[serde(default)]
    pub architecture: String,
    #[serde(default)]
    pub os: String,
    #[serde(default)]
    pub config: Option<ContainerConfig>,
    #[serde(default)]
    pub rootfs: Option<RootFs>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct ContainerConfig {
    #[serde(default)]
    pub env: Option<Vec<String>>,
    #[serde(default)]
    pub working_dir: Option<String>,
    #[serde(default)]
    pub user: Option<String>,
    #[serde(default)]
    pub entrypoint: Option<Vec<String>>,
    #[serde(default)]
    pub cmd: Option<Vec<String>>,
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct RootFs {
    #[serde(default)]
    pub diff_ids: Vec<String>,
}

impl ImageConfigFile {
    pub fn parse(bytes: &[u8], what: &str) -> Result<ImageConfigFile> {
        let config: ImageConfigFile =
            serde_json::from_slice(bytes).map_err(|e| Error::Manifest {
                what: what.into(),
                problem: format!("not a valid image config: {e}"),
            })?;
        // Empty os/architecture: some hand-made images leave them out; anything else must be
        // what the sandboxes run.
        let os_ok = config.os.is_empty() || config.os == "linux";
        let arch_ok = config.architecture.is_empty() || config.architecture == "amd64";
        if !(os_ok && arch_ok) {
            return Err(Error::Manifest {
                what: what.into(),
                problem: format!(
                    "the image is for {}/{}; Sandcell runs linux/amd64",
                    config.os, config.architecture
                ),
            });
        }
        Ok(config)
    }

    pub fn defaults(&self) -> ImageDefaults {
        let c = self.config.clone().unwrap_or_default();
        ImageDefaults {
            env: c.env.unwrap_or_default(),
            working_dir: c.working_dir.filter(|w| !w.is_empty()),
            user: c.user.filter(|u| !u.is_empty()),
            entrypoint: c.entrypoint.unwrap_or_default(),
            cmd: c.cmd.unwrap_or_default(),
            source: None,
            manifest_digest: None,
        }
    }
}

/// One layer to apply: its blob (compressed or not: the unpacker looks at the bytes) and
/// the digest of its uncompressed tar (the config's `diff_ids`) when known.
#[derive(Debug, Clone)]
pub struct Layer {
    pub digest: Digest,
    pub size: u64,
    pub diff_id: Option<Digest>,
}

/// An image ready to build: every blob it names is in the cache.
#[derive(Debug, Clone)]
pub struct ResolvedImage {
    /// What the user named (a reference or a path), for messages and `config.json`.
    pub source: String,
    pub manifest_digest: Digest,
    pub config: ImageConfigFile,
    pub layers: Vec<Layer>,
}

impl ResolvedImage {
    /// Pairs the manifest's layers with the config's diff_ids (which must be as many).
    pub fn layers_from(
        manifest_layers: &[(Digest, u64)],
        config: &ImageConfigFile,
        what: &str,
    ) -> Result<Vec<Layer>> {
        let diff_ids = config
            .rootfs
            .as_ref()
            .map(|r| r.diff_ids.as_slice())
            .unwrap_or_default();
        if !diff_ids.is_empty() && diff_ids.len() != manifest_layers.len() {
            return Err(Error::Manifest {
                what: what.into(),
                problem: format!(
                    "{} layers but {} diff_ids in the config",
                    manifest_layers.len(),
                    diff_ids.len()
                ),
            });
        }
        manifest_layers
            .iter()
            .enumerate()
            .map(|(i, (digest, size))| {
                Ok(Layer {
                    digest: digest.clone(),
                    size: *size,
                    diff_id: diff_ids.get(i).map(|d| Digest::parse(d)).transpose()?,
                })
            })
            .collect()
    }
}
