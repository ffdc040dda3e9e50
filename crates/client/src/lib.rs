//! A client of the Sandcell daemon (see `sandcell-server`).
