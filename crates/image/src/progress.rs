//! What a pull or build reports as it goes (the CLI draws progress bars from it).

/// One step of an import. Digests are `sha256:...` strings.
#[derive(Debug, Clone)]
pub enum Event {
    /// The manifest is known: this many layers of these sizes (compressed).
    Resolved {
        manifest_digest: String,
        layers: Vec<(String, u64)>,
    },
    /// A layer download starts (`cached`: it was already in the cache, nothing to fetch).
    LayerStart {
        digest: String,
        size: u64,
        cached: bool,
    },
    /// More bytes of a layer arrived (the total so far).
    LayerBytes {
        digest: String,
        bytes: u64,
    },
    LayerDone {
        digest: String,
    },
    /// Applying layer `index` (from 0) of `total`.
    Unpacking {
        index: usize,
        total: usize,
        digest: String,
    },
    /// Making the ext4 image of this size.
    Mkfs {
        size_mib: u64,
    },
}

pub trait Progress: Send + Sync {
    fn event(&self, event: Event);
}

/// Reports nothing.
pub struct NoProgress;

impl Progress for NoProgress {
    fn event(&self, _: Event) {}
}
