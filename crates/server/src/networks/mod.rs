//! Sandbox networks: the daemon's side of them ([`service`]) and their routes ([`api`]).

pub mod api;
pub mod egress_proxy;
pub mod service;
