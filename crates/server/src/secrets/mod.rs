//! E2B's secrets: stored per API key, sealed at rest ([`crypto`]), managed through E2B's
//! `/secrets` routes ([`api`]) and resolved for the egress proxy ([`service`]).

pub mod api;
pub mod cli;
pub mod crypto;
pub mod inject;
pub mod placeholders;
pub mod service;
