//! Admission: whether a new sandbox (create, restore, fork child) or a resume may take its
//! memory and disk, checked before the runtime makes anything.
//!
//! Two checks, in this order (their errors are answered in it):
//! 1. the key's quotas (keys/quota.rs: sandboxes, memory, disk): 429, as E2B answers its
//!    rate and concurrency limits, naming the limit, what the key uses and what to do;
//! 2. the host: memory of every sandbox that holds memory (all keys), plus the new one, at
//!    most `--memory-overcommit` times the host's MemTotal, and at least
//!    `--min-free-disk-mib` free on the data dir: 503 (the host is full, not the caller's
//!    fault; another host or later may do).
//!
//! What sandboxes hold comes from their rows (store/keys.rs [`InUse`]): memory is what they
//! were sized with, disk the disk size of their rows (a paused one's memory file counts as
//! disk). The checks and the insert of the new row run under one lock
//! ([`SandboxService::admit_new`]), so that concurrent creates cannot both slip under a
//! limit; a resume holds the same lock from its check until its row is `resuming`.
//!
//! The host is read through [`HostProbe`] so that the arithmetic is tested without /proc.

use crate::error::Error;
use crate::keys::quota::{QuotaDefaults, Quotas, quotas_of};
use crate::sandboxes::error::SandboxError;
use crate::sandboxes::service::SandboxService;
use crate::store::keys::InUse;
use crate::store::{KeyRow, SandboxRow};
use std::path::{Path, PathBuf};

/// Host-wide admission settings (`sandcell serve --memory-overcommit`, `--min-free-disk-mib`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct HostLimits {
    /// Sandboxes' memory may add up to this many times the host's MemTotal.
    pub memory_overcommit: f64,
    /// Creates are refused when the data dir's filesystem has less free.
    pub min_free_disk_mib: u64,
}

impl Default for HostLimits {
    fn default() -> Self {
        HostLimits {
            memory_overcommit: 1.5,
            min_free_disk_mib: 2048,
        }
    }
}

/// Everything admission is configured with.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct AdmissionConfig {
    pub key_defaults: QuotaDefaults,
    pub host: HostLimits,
}

/// The host as admission sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HostReading {
    pub mem_total_mib: u64,
    pub free_disk_mib: u64,
}

/// Reads the host ([`ProcHost`] on a real daemon; tests inject a fixed reading).
pub trait HostProbe: Send + Sync {
    fn read(&self) -> std::io::Result<HostReading>;
}

/// The real host: MemTotal from /proc/meminfo, free space of the data dir's filesystem.
pub struct ProcHost {
    pub data_dir: PathBuf,
}

impl HostProbe for ProcHost {
    fn read(&self) -> std::io::Result<HostReading> {
        let meminfo = std::fs::read_to_string("/proc/meminfo")?;
        let mem_total_mib = parse_mem_total_kib(&meminfo)
            .ok_or_else(|| std::io::Error::other("no MemTotal line in /proc/meminfo"))?
            / 1024;
        Ok(HostReading {
            mem_total_mib,
            free_disk_mib: free_disk_mib(&self.data_dir)?,
        })
    }
}

/// `MemTotal:  16318480 kB` to 16318480.
pub fn parse_mem_total_kib(meminfo: &str) -> Option<u64> {
    meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
}

/// Space an unprivileged writer may still use on the filesystem of `dir`, in MiB.
fn free_disk_mib(dir: &Path) -> std::io::Result<u64> {
    use std::os::unix::ffi::OsStrExt;
    let path = std::ffi::CString::new(dir.as_os_str().as_bytes())
        .map_err(|_| std::io::Error::other("a NUL byte in the data dir's path"))?;
    // SAFETY: statvfs is plain old data; all-zero is a valid value to be overwritten.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `path` is a valid NUL-terminated string and `st` a valid out pointer for the
    // duration of the call.
    if unsafe { libc::statvfs(path.as_ptr(), &mut st) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok((st.f_bavail as u64).saturating_mul(st.f_frsize as u64) / (1024 * 1024))
}

/// What a new sandbox, or a resume, asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ask {
    /// 1 for a new sandbox, 0 for a resume (it is already counted).
    pub sandboxes: u64,
    pub memory_mib: u64,
    /// Disk a resume frees (its memory file) is not subtracted: the check errs on room.
    pub disk_mib: u64,
}

/// Why a sandbox was not admitted.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum AdmissionError {
    /// The key's quota: 429.
    #[error(
        "{lead}this API key may have at most {limit}{unit} {what}; it has {used}{unit} and this \
         sandbox needs {asked}{unit} more: {advice}",
        lead = if *.quota == "sandboxes" {
            format!("you have reached the maximum number of concurrent sandboxes ({}) for this API key: ", .limit)
        } else {
            String::new()
        },
        unit = unit(.quota),
        what = what(.quota),
        advice = advice(.quota)
    )]
    KeyQuota {
        /// `sandboxes`, `memory` or `disk`.
        quota: &'static str,
        limit: u64,
        used: u64,
        asked: u64,
    },
    /// The host's memory: 503.
    #[error(
        "this host is at capacity: its sandboxes already hold {committed} MiB of memory and \
         this one needs {asked} MiB, past the {capacity} MiB it admits ({ratio} x its \
         {total} MiB); try again later or on another host, or kill sandboxes (the operator can \
         raise `sandcell serve --memory-overcommit`)"
    )]
    HostMemory {
        committed: u64,
        asked: u64,
        capacity: u64,
        ratio: f64,
        total: u64,
    },
    /// The data dir's disk: 503.
    #[error(
        "this host is out of disk: {free} MiB free on its data dir, below the {floor} MiB it \
         keeps free; try again later or on another host (the operator can free disk, e.g. \
         delete snapshots and templates, or lower `sandcell serve --min-free-disk-mib`)"
    )]
    HostDisk { free: u64, floor: u64 },
}

fn unit(quota: &str) -> &'static str {
    if quota == "sandboxes" { "" } else { " MiB" }
}

fn what(quota: &str) -> &'static str {
    match quota {
        "sandboxes" => "live sandboxes (running or paused)",
        "memory" => "of memory in its running sandboxes",
        _ => "of disk in its sandboxes (paused ones' memory included)",
    }
}

fn advice(quota: &str) -> &'static str {
    match quota {
        "sandboxes" => {
            "kill some (paused ones count too), or have the operator raise it with \
             `sandcell keys update <key> --max-sandboxes N`"
        }
        "memory" => {
            "kill or pause some, ask for less memoryMB, or have the operator raise it with \
             `sandcell keys update <key> --max-memory-mib N`"
        }
        _ => {
            "kill some, or have the operator raise it with \
             `sandcell keys update <key> --max-disk-mib N`"
        }
    }
}

impl AdmissionError {
    /// Whether the host (503), not the caller's key (429), is the reason.
    pub fn is_host(&self) -> bool {
        !matches!(self, AdmissionError::KeyQuota { .. })
    }
}

/// Check 1: the key's quotas against what its sandboxes hold.
pub fn check_key(quotas: &Quotas, used: &InUse, ask: &Ask) -> Result<(), AdmissionError> {
    let checks = [
        ("sandboxes", quotas.sandboxes, used.sandboxes, ask.sandboxes),
        ("memory", quotas.memory_mib, used.memory_mib, ask.memory_mib),
        ("disk", quotas.disk_mib, used.disk_mib, ask.disk_mib),
    ];
    for (quota, limit, used, asked) in checks {
        if let Some(limit) = limit
            && asked > 0
            && used.saturating_add(asked) > limit
        {
            return Err(AdmissionError::KeyQuota {
                quota,
                limit,
                used,
                asked,
            });
        }
    }
    Ok(())
}

/// Check 2: the host, with `committed_mib` held by every sandbox that holds memory.
pub fn check_host(
    host: &HostReading,
    limits: &HostLimits,
    committed_mib: u64,
    ask: &Ask,
) -> Result<(), AdmissionError> {
    if host.free_disk_mib < limits.min_free_disk_mib {
        return Err(AdmissionError::HostDisk {
            free: host.free_disk_mib,
            floor: limits.min_free_disk_mib,
        });
    }
    let capacity = (host.mem_total_mib as f64 * limits.memory_overcommit.max(0.0)) as u64;
    if ask.memory_mib > 0 && committed_mib.saturating_add(ask.memory_mib) > capacity {
        return Err(AdmissionError::HostMemory {
            committed: committed_mib,
            asked: ask.memory_mib,
            capacity,
            ratio: limits.memory_overcommit,
            total: host.mem_total_mib,
        });
    }
    Ok(())
}

impl SandboxService {
    /// Both checks for what `key` asks; `None` for the host when it cannot be read (logged:
    /// a host we cannot read is not a reason to refuse every create).
    async fn check(&self, key: &KeyRow, ask: &Ask) -> Result<(), SandboxError> {
        let quotas = quotas_of(key, &self.admission.key_defaults);
        let used = self.db.in_use(Some(&key.id)).await?;
        check_key(&quotas, &used, ask)?;
        match self.host.read() {
            Ok(host) => {
                let all = self.db.in_use(None).await?;
                check_host(&host, &self.admission.host, all.memory_mib, ask)?;
            }
            Err(e) => tracing::warn!("admission: cannot read the host ({e}); not checking it"),
        }
        Ok(())
    }

    /// Admits the new sandbox `row` of `key` (state `creating`) and inserts it: the key's
    /// quotas, the host, then the insert, under the admission lock.
    pub(crate) async fn admit_new(
        &self,
        key: &KeyRow,
        row: &SandboxRow,
    ) -> Result<(), SandboxError> {
        let ask = Ask {
            sandboxes: 1,
            memory_mib: u64::from(row.memory_mib),
            disk_mib: u64::from(row.disk_mib),
        };
        let _held = self.admission_lock.lock().await;
        self.check(key, &ask).await?;
        // The count again in the insert itself: belt and braces for a second writer of the
        // database (the lock is this daemon's).
        let max = quotas_of(key, &self.admission.key_defaults)
            .sandboxes
            .map(|n| u32::try_from(n).unwrap_or(u32::MAX));
        if !self.db.insert_sandbox_within_limit(row, max).await? {
            let used = self.db.in_use(Some(&key.id)).await?;
            return Err(AdmissionError::KeyQuota {
                quota: "sandboxes",
                limit: max.map_or(0, u64::from),
                used: used.sandboxes,
                asked: 1,
            }
            .into());
        }
        Ok(())
    }

    /// Whether paused sandbox `row` may take its memory back (a resume): the key's memory
    /// quota and the host's memory. Its owner's key is read from the database. The caller
    /// holds the returned guard until the row is `resuming` (then counted as memory).
    pub(crate) async fn admit_resume(
        &self,
        row: &SandboxRow,
    ) -> Result<tokio::sync::MutexGuard<'_, ()>, SandboxError> {
        let Some(key) = self.db.key_by_id(&row.key_id).await? else {
            return Err(Error::Io {
                what: format!(
                    "resuming sandbox {}: its key {} is gone",
                    row.id, row.key_id
                ),
                source: std::io::Error::from(std::io::ErrorKind::NotFound),
            }
            .into());
        };
        let ask = Ask {
            sandboxes: 0,
            memory_mib: u64::from(row.memory_mib),
            disk_mib: 0,
        };
        let held = self.admission_lock.lock().await;
        self.check(&key, &ask).await?;
        Ok(held)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn quotas(sandboxes: u64, memory: u64, disk: u64) -> Quotas {
        Quotas {
            sandboxes: Some(sandboxes),
            memory_mib: Some(memory),
            disk_mib: Some(disk),
            builds: None,
            upload_mib: None,
        }
    }

    const NEW_512: Ask = Ask {
        sandboxes: 1,
        memory_mib: 512,
        disk_mib: 1024,
    };

    #[test]
    fn key_quotas_refuse_past_each_limit_and_say_which() {
        let q = quotas(3, 2048, 10_240);
        let used = InUse {
            sandboxes: 2,
            memory_mib: 1536,
            disk_mib: 2048,
        };
        // 1536 + 512 = 2048: exactly at the limit is allowed.
        assert_eq!(check_key(&q, &used, &NEW_512), Ok(()));
        let more = InUse {
            memory_mib: 1537,
            ..used
        };
        let e = check_key(&q, &more, &NEW_512).unwrap_err();
        assert_eq!(
            e,
            AdmissionError::KeyQuota {
                quota: "memory",
                limit: 2048,
                used: 1537,
                asked: 512
            }
        );
        let text = e.to_string();
        assert!(
            text.contains("2048 MiB") && text.contains("1537 MiB"),
            "{text}"
        );
        assert!(text.contains("--max-memory-mib"), "{text}");
        assert!(!e.is_host());
        let full = InUse {
            sandboxes: 3,
            ..used
        };
        let e = check_key(&q, &full, &NEW_512).unwrap_err();
        assert!(matches!(
            e,
            AdmissionError::KeyQuota {
                quota: "sandboxes",
                ..
            }
        ));
        assert!(
            e.to_string()
                .starts_with("you have reached the maximum number of concurrent sandboxes (3)"),
            "{e}"
        );
        let disk = InUse {
            disk_mib: 9217,
            ..used
        };
        assert!(matches!(
            check_key(&q, &disk, &NEW_512),
            Err(AdmissionError::KeyQuota { quota: "disk", .. })
        ));
        // No limit: anything goes.
        let none = Quotas {
            sandboxes: None,
            memory_mib: None,
            disk_mib: None,
            builds: None,
            upload_mib: None,
        };
        let huge = InUse {
            sandboxes: u64::MAX,
            memory_mib: u64::MAX,
            disk_mib: u64::MAX,
        };
        assert_eq!(check_key(&none, &huge, &NEW_512), Ok(()));
    }

    #[test]
    fn a_resume_is_not_a_new_sandbox() {
        let q = quotas(2, 1024, 100);
        let used = InUse {
            sandboxes: 2,
            memory_mib: 512,
            disk_mib: 5000,
        };
        let resume = Ask {
            sandboxes: 0,
            memory_mib: 512,
            disk_mib: 0,
        };
        // At its sandbox and over its disk limit, but a resume asks neither.
        assert_eq!(check_key(&q, &used, &resume), Ok(()));
        let busy = InUse {
            memory_mib: 513,
            ..used
        };
        assert!(check_key(&q, &busy, &resume).is_err());
    }

    #[test]
    fn the_host_admits_up_to_its_overcommit_ratio() {
        let host = HostReading {
            mem_total_mib: 4096,
            free_disk_mib: 50_000,
        };
        let limits = HostLimits {
            memory_overcommit: 1.5,
            min_free_disk_mib: 2048,
        };
        // Capacity 6144: 5632 + 512 fits, one MiB more does not.
        assert_eq!(check_host(&host, &limits, 5632, &NEW_512), Ok(()));
        let e = check_host(&host, &limits, 5633, &NEW_512).unwrap_err();
        assert_eq!(
            e,
            AdmissionError::HostMemory {
                committed: 5633,
                asked: 512,
                capacity: 6144,
                ratio: 1.5,
                total: 4096
            }
        );
        assert!(e.is_host());
        assert!(e.to_string().contains("--memory-overcommit"), "{e}");
        // A ratio below 1 keeps memory in reserve.
        let tight = HostLimits {
            memory_overcommit: 0.5,
            ..limits
        };
        assert!(check_host(&host, &tight, 1600, &NEW_512).is_err());
        assert!(check_host(&host, &tight, 1536, &NEW_512).is_ok());
    }

    #[test]
    fn the_host_keeps_its_disk_floor() {
        let limits = HostLimits::default();
        let low = HostReading {
            mem_total_mib: 1 << 20,
            free_disk_mib: 2047,
        };
        let e = check_host(&low, &limits, 0, &NEW_512).unwrap_err();
        assert_eq!(
            e,
            AdmissionError::HostDisk {
                free: 2047,
                floor: 2048
            }
        );
        assert!(e.to_string().contains("--min-free-disk-mib"), "{e}");
        let ok = HostReading {
            free_disk_mib: 2048,
            ..low
        };
        assert!(check_host(&ok, &limits, 0, &NEW_512).is_ok());
    }

    #[test]
    fn mem_total_is_read_from_meminfo() {
        let text = "MemFree:  100 kB\nMemTotal:       16318480 kB\nBuffers: 1 kB\n";
        assert_eq!(parse_mem_total_kib(text), Some(16_318_480));
        assert_eq!(parse_mem_total_kib("MemFree: 3 kB\n"), None);
        assert_eq!(parse_mem_total_kib("MemTotal: lots kB\n"), None);
    }

    #[test]
    fn the_real_host_reads() {
        let tmp = tempfile::tempdir().unwrap();
        let r = ProcHost {
            data_dir: tmp.path().to_path_buf(),
        }
        .read()
        .unwrap();
        assert!(r.mem_total_mib > 0);
        assert!(
            ProcHost {
                data_dir: tmp.path().join("missing")
            }
            .read()
            .is_err()
        );
    }
}
