//! Sandcell's virtual machine monitor on the rust-vmm crates (library + sandcell-vmm binary)
