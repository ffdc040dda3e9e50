//! The sandcell command
