//! KVM: the VM file descriptor and the vCPU threads.

pub mod vcpu;
pub mod vcpu_state;
pub mod vm;
