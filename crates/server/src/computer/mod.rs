//! The Computer API (our extension): screenshots, mouse, keyboard, windows and launching
//! programs in a sandbox with a desktop, as REST routes (`api.rs`) that run the desktop's
//! own tools through the sandbox's agent (`service.rs`); which tool and arguments each
//! call becomes is in `commands.rs`, key names in `keys.rs`.

pub mod api;
pub mod commands;
pub mod error;
pub mod keys;
pub mod service;
