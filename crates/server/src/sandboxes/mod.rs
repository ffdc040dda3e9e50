//! Sandboxes: the control API's sandbox routes ([`api`]), the service that creates, kills,
//! times out and re-adopts them ([`service`]), their states ([`state`]), their JSON
//! ([`models`]), what they consumed ([`metering`]), their CPU, memory and disk over time
//! ([`metrics`], [`metrics_api`]) and whether a new one fits its key's quotas and the host
//! ([`admission`]), and the creates a stopping daemon waits for ([`stopping`]).

pub mod admission;
pub mod api;
pub mod create;
pub mod error;
pub mod logs;
pub mod metering;
pub mod metrics;
pub mod metrics_api;
pub mod models;
pub mod reaper;
pub mod reconcile;
pub mod service;
pub mod state;
pub mod stopping;
pub mod warm;
