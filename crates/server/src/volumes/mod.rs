//! E2B's volumes: persistent filesystems of a key that outlive sandboxes, their data in
//! the operator's S3-compatible bucket. Each volume is a JuiceFS filesystem ([`juicefs`])
//! mounted on the host with FUSE and bound into gVisor sandboxes through the gofer; the
//! routes are E2B's `/volumes` ([`api`]); [`service`] keeps the rows, the mounts and the
//! rules (per key, 409 while mounted); [`shared`] keeps a volume's lease and published
//! metadata in the bucket, so that another daemon can mount it. The model and its limits: docs/volumes.md.

pub mod api;
pub mod bucket;
pub mod config;
pub mod content;
pub mod content_api;
pub mod juicefs;
pub mod service;
pub mod shared;
pub mod storage;
