//! Choosing a runtime. `auto` prefers `microvm` and proves it first: a short self-test boots
//! the guest kernel with the image and waits for the agent's health answer. The verdict is
//! cached in `<data-dir>/cache/microvm-selftest.json`, keyed by the host kernel release, the
//! identity of /dev/kvm, the guest kernel's content hash and the VMM binary, so that hosts
//! like the project's (PVM: the guest cannot boot) pay for the test once. Everything that
//! rules the microVM out without a test (no /dev/kvm, no VMM, no kernel) costs nothing.

use crate::microvm::MicrovmRuntime;
use crate::{Dirs, Image, Runtime, RuntimeKind, Sandbox, SandboxSpec};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

const VERDICT_FILE: &str = "microvm-selftest.json";
const KERNEL_HASH_FILE: &str = "kernel-hash.json";
/// The whole self-test, boot to health answer.
const SELF_TEST_BOOT: Duration = Duration::from_secs(5);
const SELF_TEST_HEALTH: Duration = Duration::from_secs(2);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RuntimeChoice {
    Auto,
    Microvm,
    Gvisor,
}

impl std::str::FromStr for RuntimeChoice {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(RuntimeChoice::Auto),
            "microvm" => Ok(RuntimeChoice::Microvm),
            "gvisor" => Ok(RuntimeChoice::Gvisor),
            other => Err(format!(
                "unknown runtime {other:?}: use auto, microvm or gvisor"
            )),
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct Selection {
    pub runtime: RuntimeKind,
    /// One sentence: why this runtime.
    pub reason: String,
    /// `auto` settled for gVisor although microVMs are preferred: say so once on stderr.
    pub fell_back: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Verdict {
    key: String,
    microvm_works: bool,
    reason: String,
    tested_at_unix: u64,
    took_ms: u64,
}

/// Picks the runtime for `choice`. Never fails: `auto` falls back to gVisor with a reason.
/// `image` is the image the self-test boots (its rootfs.ext4).
pub async fn choose(
    choice: RuntimeChoice,
    dirs: &Dirs,
    kernel: Option<PathBuf>,
    image: Option<&Image>,
) -> Selection {
    match choice {
        RuntimeChoice::Gvisor => Selection {
            runtime: RuntimeKind::Gvisor,
            reason: "requested with --runtime gvisor".into(),
            fell_back: false,
        },
        RuntimeChoice::Microvm => Selection {
            runtime: RuntimeKind::Microvm,
            reason: "requested with --runtime microvm".into(),
            fell_back: false,
        },
        RuntimeChoice::Auto => match auto(dirs, kernel, image).await {
            Ok(reason) => Selection {
                runtime: RuntimeKind::Microvm,
                reason,
                fell_back: false,
            },
            Err(why_not) => Selection {
                runtime: RuntimeKind::Gvisor,
                reason: why_not,
                fell_back: true,
            },
        },
    }
}

/// `Ok(why microvm)` or `Err(why not)`.
async fn auto(
    dirs: &Dirs,
    kernel: Option<PathBuf>,
    image: Option<&Image>,
) -> Result<String, String> {
    let kvm = crate::host::kvm_info();
    if !kvm.usable {
        return Err(format!("no usable KVM on this host ({})", kvm.detail));
    }
    let Some(vmm) = crate::microvm::find_vmm() else {
        return Err("sandcell-vmm was not found next to sandcell (set SANDCELL_VMM)".into());
    };
    let kernel = kernel.unwrap_or_else(|| dirs.default_kernel());
    if !kernel.is_file() {
        return Err(format!(
            "no guest kernel at {} (`make kernel install`)",
            kernel.display()
        ));
    }
    let Some(image) = image.filter(|i| i.rootfs_ext4.is_some()) else {
        return Err("the image has no rootfs.ext4 to boot a microVM from".into());
    };
    let key = format!(
        "host={} kvm=[{}] kernel={} vmm={}",
        crate::host::host_kernel_release(),
        crate::host::kvm_identity(),
        kernel_hash(dirs, &kernel)
            .map_err(|e| format!("reading the guest kernel {}: {e}", kernel.display()))?,
        file_identity(&vmm),
    );
    let cache = dirs.cache_file(VERDICT_FILE);
    let cached = std::fs::read(&cache)
        .ok()
        .and_then(|b| serde_json::from_slice::<Verdict>(&b).ok())
        .filter(|v| v.key == key);
    let (verdict, from_cache) = match cached {
        Some(v) => (v, true),
        None => {
            let v = self_test(dirs, &kernel, image, key).await;
            // Without a writable cache the test simply runs again next time.
            if let Ok(json) = serde_json::to_vec_pretty(&v) {
                let _ = crate::util::write_atomic(&cache, &json);
            }
            (v, false)
        }
    };
    let note = if from_cache {
        format!(" (cached in {}; delete it to test again)", cache.display())
    } else {
        String::new()
    };
    if verdict.microvm_works {
        Ok(format!("the microVM self-test passed{note}"))
    } else {
        Err(format!(
            "the microVM self-test failed: {}{note}",
            verdict.reason
        ))
    }
}

async fn self_test(dirs: &Dirs, kernel: &Path, image: &Image, key: String) -> Verdict {
    let started = Instant::now();
    let result = boot_and_check(dirs, kernel, image).await;
    Verdict {
        key,
        microvm_works: result.is_ok(),
        reason: result.err().unwrap_or_default(),
        tested_at_unix: SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
        took_ms: started.elapsed().as_millis() as u64,
    }
}

async fn boot_and_check(dirs: &Dirs, kernel: &Path, image: &Image) -> Result<(), String> {
    let runtime = MicrovmRuntime::new(dirs.clone(), sandcell_net::NetRegistry::new())
        .map_err(|e| e.to_string())?;
    let id = crate::new_sandbox_id()
        .map_err(|e| e.to_string())?
        .replacen("sc-", "selftest-", 1);
    let mut spec = SandboxSpec::new(id, image.clone());
    spec.memory_mib = 128;
    spec.kernel = Some(kernel.to_path_buf());
    spec.boot_timeout = SELF_TEST_BOOT;
    let sandbox: Arc<dyn Sandbox> =
        Arc::from(runtime.create(spec).await.map_err(|e| e.to_string())?);
    let checked = async {
        sandbox.start().await.map_err(|e| match e {
            crate::Error::EndedDuringStart { exit, .. } => exit.to_string(),
            crate::Error::BootTimeout { timeout, .. } => {
                format!("the guest did not reach its agent within {timeout:?}")
            }
            other => first_line(&other.to_string()),
        })?;
        match tokio::time::timeout(
            SELF_TEST_HEALTH,
            crate::agent_client(sandbox.clone()).health(),
        )
        .await
        {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(format!("the agent did not answer its health check: {e}")),
            Err(_) => Err(format!(
                "the agent did not answer its health check within {SELF_TEST_HEALTH:?}"
            )),
        }
    }
    .await;
    let _ = sandbox.destroy().await;
    checked
}

fn first_line(s: &str) -> String {
    s.lines().next().unwrap_or("").to_string()
}

fn file_identity(path: &Path) -> String {
    use std::os::unix::fs::MetadataExt;
    match std::fs::metadata(path) {
        Ok(m) => format!(
            "{}:{}:{}:{}",
            path.display(),
            m.len(),
            m.mtime(),
            m.mtime_nsec()
        ),
        Err(_) => path.display().to_string(),
    }
}

#[derive(Serialize, Deserialize)]
struct KernelHash {
    identity: String,
    hash: String,
}

/// A content hash of the guest kernel, memoized by path, size and mtime (hashing 17 MB on
/// every `sandcell run` would cost more than the choice is worth).
fn kernel_hash(dirs: &Dirs, kernel: &Path) -> std::io::Result<String> {
    let identity = file_identity(kernel);
    let memo = dirs.cache_file(KERNEL_HASH_FILE);
    if let Some(m) = std::fs::read(&memo)
        .ok()
        .and_then(|b| serde_json::from_slice::<KernelHash>(&b).ok())
        && m.identity == identity
    {
        return Ok(m.hash);
    }
    let hash = format!("{:016x}", fnv1a64(&std::fs::read(kernel)?));
    if let Ok(json) = serde_json::to_vec(&KernelHash {
        identity,
        hash: hash.clone(),
    }) {
        let _ = crate::util::write_atomic(&memo, &json);
    }
    Ok(hash)
}

/// FNV-1a, 64-bit: stable across builds and Rust versions (unlike `DefaultHasher`).
fn fnv1a64(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fnv_matches_reference_values() {
        assert_eq!(fnv1a64(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a64(b"a"), 0xaf63_dc4c_8601_ec8c);
    }

    #[test]
    fn choice_parses() {
        assert_eq!("auto".parse::<RuntimeChoice>(), Ok(RuntimeChoice::Auto));
        assert!("kvm".parse::<RuntimeChoice>().is_err());
    }

    #[tokio::test]
    async fn auto_without_a_kernel_falls_back_with_a_reason() {
        let tmp = tempfile::tempdir().unwrap();
        let dirs = Dirs::new(tmp.path().join("data"), tmp.path().join("run"));
        let sel = choose(
            RuntimeChoice::Auto,
            &dirs,
            Some(tmp.path().join("none")),
            None,
        )
        .await;
        assert_eq!(sel.runtime, RuntimeKind::Gvisor);
        assert!(sel.fell_back);
        assert!(!sel.reason.is_empty());
    }
}
