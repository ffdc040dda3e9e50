//! The Sandcell guest agent: PID 1 and an envd-shaped HTTP server
