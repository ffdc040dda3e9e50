//! Templates: E2B template builds through the API ([`api`], [`builds`], [`plan`]), their
//! tags ([`tags`]), memory snapshots ([`snapshot`]) and start/ready commands ([`start`]),
//! the defaults an OCI image carries ([`defaults`]), and the Dockerfile step runner
//! ([`runner`]).

pub mod api;
pub mod builds;
pub mod defaults;
pub mod delete;
pub mod list;
pub mod plan;
pub mod runner;
pub mod snapshot;
pub mod start;
pub mod tags;
