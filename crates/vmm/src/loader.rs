//! Loading the kernel (ELF vmlinux, else bzImage) and building its command line.

use std::fs::File;
use std::path::Path;

use linux_loader::cmdline::Cmdline;
use linux_loader::loader::bootparam::setup_header;
use linux_loader::loader::{self, KernelLoader};
use vm_memory::GuestAddress;

use crate::arch::x86_64::layout::{CMDLINE, CMDLINE_MAX_SIZE, HIMEM_START};
use crate::memory::GuestMemory;

#[derive(Debug, thiserror::Error)]
pub enum LoaderError {
    #[error("opening the kernel {path} failed: {source}")]
    Open {
        path: String,
        source: std::io::Error,
    },
    #[error("loading the ELF kernel {path} failed: {source}")]
    Elf { path: String, source: loader::Error },
    #[error("{path} is neither an ELF vmlinux nor a bzImage (bzImage load: {source})")]
    BzImage { path: String, source: loader::Error },
    #[error("the bzImage {path} has no 64-bit entry point (xloadflags XLF_KERNEL_64 unset)")]
    BzImageNot64 { path: String },
    #[error("the kernel command line is invalid: {0}")]
    Cmdline(linux_loader::cmdline::Error),
    #[error("writing the kernel command line to guest memory failed: {0}")]
    WriteCmdline(loader::Error),
}

/// Where the kernel landed and how to enter it.
#[derive(Debug, Clone, Copy)]
pub struct LoadedKernel {
    /// 64-bit entry point (guest physical; the boot page tables identity-map it).
    pub entry: u64,
    /// The bzImage's setup header, to be copied into the zero page; None for ELF.
    pub setup_header: Option<setup_header>,
}

/// `xloadflags` bit 0: the kernel has the 64-bit entry point at load address + 0x200.
const XLF_KERNEL_64: u16 = 1;
const BZIMAGE_64BIT_ENTRY_OFFSET: u64 = 0x200;

pub fn load_kernel(mem: &GuestMemory, path: &Path) -> Result<LoadedKernel, LoaderError> {
    let shown = path.display().to_string();
    let mut file = File::open(path).map_err(|source| LoaderError::Open {
        path: shown.clone(),
        source,
    })?;
    // The ELF loader places each PT_LOAD segment at its p_paddr and refuses anything below
    // HIMEM_START, which keeps the kernel clear of our boot structures in low memory.
    match loader::Elf::load(mem, None, &mut file, Some(GuestAddress(HIMEM_START))) {
        Ok(result) => {
            // For a vmlinux, e_entry is the physical address of startup_64.
            return Ok(LoadedKernel {
                entry: result.kernel_load.0,
                setup_header: None,
            });
        }
        Err(loader::Error::Elf(loader::elf::Error::InvalidElfMagicNumber)) => {}
        Err(source) => {
            return Err(LoaderError::Elf {
                path: shown,
                source,
            });
        }
    }
    let result = loader::BzImage::load(mem, None, &mut file, Some(GuestAddress(HIMEM_START)))
        .map_err(|source| LoaderError::BzImage {
            path: shown.clone(),
            source,
        })?;
    let header = result.setup_header.unwrap_or_default();
    if header.xloadflags & XLF_KERNEL_64 == 0 {
        return Err(LoaderError::BzImageNot64 { path: shown });
    }
    Ok(LoadedKernel {
        entry: result.kernel_load.0 + BZIMAGE_64BIT_ENTRY_OFFSET,
        setup_header: Some(header),
    })
}

/// Parameters added unless the user's command line already has them (same key, or the
/// same bare flag):
/// - `console=ttyS0`: COM1 is the only console.
/// - `reboot=k`: reboot through the i8042 (the one reset path we emulate; the VMM sees it).
/// - `panic=-1`: reboot at once on a panic, so the VMM exits with GuestPanic instead of the
///   guest spinning forever.
/// - `pci=off`: there is no PCI bus; skip probing config space ports.
/// - `i8042.noaux i8042.nomux i8042.nopnp i8042.dumbkbd`: our i8042 has no mouse port, no
///   multiplexer, no PnP description and no keyboard: skip the probes (each costs exits and
///   timeouts).
/// - `8250.nr_uarts=1`: only COM1 exists; do not probe COM2-4.
/// - `swiotlb=noforce`: no device needs bounce buffers; saves the 64 MiB default pool.
///
/// `nomodule(s)` is not added: the guest kernel has no module support, and an unknown bare
/// word would be passed to init as an argument.
pub const DEFAULT_PARAMS: &[&str] = &[
    "console=ttyS0",
    "reboot=k",
    "panic=-1",
    "pci=off",
    "i8042.noaux",
    "i8042.nomux",
    "i8042.nopnp",
    "i8042.dumbkbd",
    "8250.nr_uarts=1",
    "swiotlb=noforce",
];

/// One virtio-mmio device for the command line.
#[derive(Debug, Clone, Copy)]
pub struct VirtioMmioDecl {
    pub base: u64,
    pub size: u64,
    pub irq: u32,
}

fn param_key(p: &str) -> &str {
    p.split_once('=').map_or(p, |(k, _)| k)
}

/// The kernel command line: the user's kernel parameters, our defaults for those not set,
/// the virtio-mmio device declarations, then the user's init arguments (after ` -- `).
pub fn build_cmdline(user: &str, virtio: &[VirtioMmioDecl]) -> Result<Cmdline, LoaderError> {
    let (kernel_part, init_part) = match user.split_once(" -- ") {
        Some((k, i)) => (k, Some(i)),
        None => match user.strip_prefix("-- ") {
            Some(i) => ("", Some(i)),
            None => (user, None),
        },
    };
    let user_keys: Vec<&str> = kernel_part.split_whitespace().map(param_key).collect();
    let mut cmdline = Cmdline::new(CMDLINE_MAX_SIZE).map_err(LoaderError::Cmdline)?;
    if !kernel_part.trim().is_empty() {
        cmdline
            .insert_str(kernel_part.trim())
            .map_err(LoaderError::Cmdline)?;
    }
    for param in DEFAULT_PARAMS {
        if !user_keys.contains(&param_key(param)) {
            cmdline.insert_str(param).map_err(LoaderError::Cmdline)?;
        }
    }
    for d in virtio {
        cmdline
            .add_virtio_mmio_device(d.size, GuestAddress(d.base), d.irq, None)
            .map_err(LoaderError::Cmdline)?;
    }
    if let Some(init) = init_part
        && !init.trim().is_empty()
    {
        cmdline
            .insert_init_args(init.trim())
            .map_err(LoaderError::Cmdline)?;
    }
    Ok(cmdline)
}

/// Writes the command line (NUL-terminated) at CMDLINE; returns its length without the NUL.
pub fn write_cmdline(mem: &GuestMemory, cmdline: &Cmdline) -> Result<usize, LoaderError> {
    loader::load_cmdline(mem, GuestAddress(CMDLINE), cmdline).map_err(LoaderError::WriteCmdline)?;
    let len = cmdline
        .as_cstring()
        .map_err(LoaderError::Cmdline)?
        .as_bytes()
        .len();
    Ok(len)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn render(c: &Cmdline) -> String {
        c.as_cstring()
            .expect("cstring")
            .into_string()
            .expect("utf8")
    }

    #[test]
    fn defaults_are_added_when_absent() {
        let c = build_cmdline("", &[]).expect("cmdline");
        assert_eq!(render(&c), DEFAULT_PARAMS.join(" "));
    }

    #[test]
    fn user_values_win_over_defaults() {
        let c = build_cmdline("console=hvc0 panic=5 quiet i8042.noaux", &[]).expect("cmdline");
        let s = render(&c);
        assert!(
            s.starts_with("console=hvc0 panic=5 quiet i8042.noaux "),
            "{s}"
        );
        assert!(!s.contains("console=ttyS0"), "{s}");
        assert!(!s.contains("panic=-1"), "{s}");
        assert_eq!(s.matches("i8042.noaux").count(), 1, "{s}");
        assert!(s.contains("reboot=k"));
    }

    #[test]
    fn virtio_devices_and_init_args_are_placed_right() {
        let devs = [
            VirtioMmioDecl {
                base: 0xd000_0000,
                size: 0x1000,
                irq: 5,
            },
            VirtioMmioDecl {
                base: 0xd000_1000,
                size: 0x1000,
                irq: 6,
            },
        ];
        let c = build_cmdline("root=/dev/vda -- --agent-flag x", &devs).expect("cmdline");
        let s = render(&c);
        assert!(
            s.contains("virtio_mmio.device=4K@0xd0000000:5 virtio_mmio.device=4K@0xd0001000:6"),
            "{s}"
        );
        assert!(s.ends_with(" -- --agent-flag x"), "{s}");
        assert!(s.starts_with("root=/dev/vda console=ttyS0"), "{s}");
    }

    #[test]
    fn overlong_cmdline_is_an_error() {
        let long = "x".repeat(CMDLINE_MAX_SIZE);
        assert!(matches!(
            build_cmdline(&long, &[]),
            Err(LoaderError::Cmdline(_))
        ));
    }
}
