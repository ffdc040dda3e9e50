//! Pause and resume ([`pause`]), named snapshots and fork ([`fork`]),
//! creates from a snapshot ([`restore`]), and their routes ([`api`]).

pub mod api;
pub mod error;
pub mod fork;
pub mod ops;
pub mod pause;
pub mod restore;
