//! Templates: who may see and change them ([`access`]), E2B template builds through the API ([`api`], [`builds`], [`plan`]), their
//! tags ([`tags`]), memory snapshots ([`memory_snapshot`], [`installed_snapshot`] for installed templates) and start/ready commands ([`start`]),
//! and the defaults an OCI image carries ([`defaults`]). The Dockerfile step runner the
//! builds use is `sandcell_runtime::build_steps`, next to the runtime it drives.

pub mod access;
pub mod api;
pub mod builds;
pub mod defaults;
pub mod delete;
pub mod error;
pub mod installed_snapshot;
pub mod list;
pub mod memory_snapshot;
pub mod plan;
pub mod start;
pub mod tags;
