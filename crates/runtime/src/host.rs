//! What this host offers the runtimes, for `sandcell doctor` and the automatic choice.

use crate::cgroup::{self, CgroupVersion};
use crate::gvisor::RunscInfo;
use crate::select::Selection;
use crate::{Dirs, Image};
use serde::Serialize;
use std::path::{Path, PathBuf};

/// `_IO(KVMIO, 0x00)`.
const KVM_GET_API_VERSION: libc::c_ulong = 0xAE00;
const KVM_API_VERSION: i32 = 12;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum KvmKind {
    /// Intel VT-x (`vmx` in /proc/cpuinfo).
    VtX,
    /// AMD-V (`svm`).
    AmdV,
    /// Pagetable-based virtual machine (`kvm_pvm`): runs only PVM-enlightened guest kernels.
    Pvm,
    /// /dev/kvm works but the CPU shows neither flag and no PVM module is loaded.
    Unknown,
    /// No usable /dev/kvm.
    None,
}

#[derive(Debug, Clone, Serialize)]
pub struct KvmInfo {
    pub present: bool,
    /// Opened read-write and answered KVM_GET_API_VERSION with 12.
    pub usable: bool,
    pub kind: KvmKind,
    pub detail: String,
}

/// Looks at /dev/kvm, the CPU flags and the loaded modules.
pub fn kvm_info() -> KvmInfo {
    let present = Path::new("/dev/kvm").exists();
    let (usable, open_detail) = if present {
        probe_kvm()
    } else {
        (false, "no /dev/kvm".to_string())
    };
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let flags: Vec<&str> = cpuinfo
        .lines()
        .find(|l| l.starts_with("flags"))
        .and_then(|l| l.split_once(':'))
        .map(|(_, f)| f.split_whitespace().collect())
        .unwrap_or_default();
    let (vmx, svm) = (flags.contains(&"vmx"), flags.contains(&"svm"));
    let pvm_module = Path::new("/sys/module/kvm_pvm").exists();
    let kind = if !usable {
        KvmKind::None
    } else if pvm_module || (!vmx && !svm) {
        // No hardware virtualization visible yet KVM works: PVM (or something like it).
        KvmKind::Pvm
    } else if vmx {
        KvmKind::VtX
    } else if svm {
        KvmKind::AmdV
    } else {
        KvmKind::Unknown
    };
    let detail = match kind {
        KvmKind::Pvm => format!(
            "{}; no vmx/svm CPU flag{}: runs only PVM-enlightened guest kernels",
            open_detail,
            if pvm_module {
                ", kvm_pvm module loaded"
            } else {
                ""
            }
        ),
        _ => open_detail,
    };
    KvmInfo {
        present,
        usable,
        kind,
        detail,
    }
}

fn probe_kvm() -> (bool, String) {
    let file = match std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/kvm")
    {
        Ok(f) => f,
        Err(e) => return (false, format!("/dev/kvm cannot be opened read-write: {e}")),
    };
    use std::os::fd::AsRawFd;
    // SAFETY: KVM_GET_API_VERSION takes no argument and only returns a number.
    let version = unsafe { libc::ioctl(file.as_raw_fd(), KVM_GET_API_VERSION, 0) };
    if version == KVM_API_VERSION {
        (true, "/dev/kvm answers (API 12)".into())
    } else {
        (
            false,
            format!("/dev/kvm answered KVM_GET_API_VERSION with {version}"),
        )
    }
}

/// Identifies this host's KVM for caches: device number, kind and KVM modules loaded.
pub fn kvm_identity() -> String {
    use std::os::unix::fs::MetadataExt;
    let rdev = std::fs::metadata("/dev/kvm").map(|m| m.rdev()).unwrap_or(0);
    let modules: Vec<&str> = ["kvm_intel", "kvm_amd", "kvm_pvm"]
        .into_iter()
        .filter(|m| Path::new("/sys/module").join(m).exists())
        .collect();
    format!(
        "rdev={rdev:x} kind={:?} modules={}",
        kvm_info().kind,
        modules.join(",")
    )
}

pub fn host_kernel_release() -> String {
    std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

/// Resident memory (bytes) and CPU time (µs, user + system) of `pid`, from /proc.
pub fn process_usage(pid: u32) -> (Option<u64>, Option<u64>) {
    let rss = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<u64>().ok())
                .map(|kb| kb * 1024)
        });
    let cpu = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            let rest = &s[s.rfind(')')? + 1..];
            let mut fields = rest.split_whitespace();
            // utime and stime are fields 14 and 15, i.e. the 12th and 13th after the name.
            let utime: u64 = fields.nth(11)?.parse().ok()?;
            let stime: u64 = fields.next()?.parse().ok()?;
            // SAFETY: sysconf has no memory effects.
            let hz = u64::try_from(unsafe { libc::sysconf(libc::_SC_CLK_TCK) })
                .ok()
                .filter(|h| *h > 0)?;
            Some((utime + stime) * 1_000_000 / hz)
        });
    (rss, cpu)
}

/// `nft --version`, if nftables is installed.
pub async fn nft_version() -> Option<String> {
    let out = tokio::process::Command::new("nft")
        .arg("--version")
        .output()
        .await
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

#[derive(Debug, Clone, Serialize)]
pub struct GuestKernel {
    pub path: PathBuf,
    pub present: bool,
}

#[derive(Debug, Clone, Serialize)]
pub struct HostReport {
    pub host_kernel: String,
    pub kvm: KvmInfo,
    pub cgroup: Option<CgroupVersion>,
    /// runsc as detected, or why not.
    pub runsc: Result<RunscInfo, String>,
    pub nftables: Option<String>,
    pub vmm: Option<PathBuf>,
    pub guest_kernel: GuestKernel,
    pub data_dir: PathBuf,
    /// What `--runtime auto` picks here, and why.
    pub auto: Selection,
}

/// Everything `sandcell doctor` shows. May run the microVM self-test (a few seconds, once
/// per host and kernel).
pub async fn report(dirs: &Dirs, kernel: Option<PathBuf>, image: Option<&Image>) -> HostReport {
    let guest_kernel = kernel.clone().unwrap_or_else(|| dirs.default_kernel());
    let runsc = RunscInfo::detect(dirs).await.map_err(|e| e.to_string());
    let auto = crate::select::choose(crate::select::RuntimeChoice::Auto, dirs, kernel, image).await;
    HostReport {
        host_kernel: host_kernel_release(),
        kvm: kvm_info(),
        cgroup: cgroup::detect_version(),
        runsc,
        nftables: nft_version().await,
        vmm: crate::microvm::find_vmm(),
        guest_kernel: GuestKernel {
            present: guest_kernel.is_file(),
            path: guest_kernel,
        },
        data_dir: dirs.data.clone(),
        auto,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn our_own_usage_is_visible() {
        let (rss, cpu) = process_usage(std::process::id());
        assert!(rss.unwrap() > 0);
        assert!(cpu.is_some());
    }

    #[test]
    fn kvm_kind_is_consistent_with_usability() {
        let k = kvm_info();
        assert_eq!(k.kind == KvmKind::None, !k.usable, "{k:?}");
    }
}
