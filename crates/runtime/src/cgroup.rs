//! Per-sandbox cgroups: `/sandcell/<id>`, created by us with the sandbox's limits before the
//! runtime starts, removed by us after it ends.
//!
//! Creating the cgroup ourselves (rather than letting runsc do it from the OCI spec) is what
//! lets us report an out-of-memory kill: runsc removes the cgroups it made as soon as the
//! sandbox dies, taking the `oom_kill` counter with them, but it joins a pre-created cgroup
//! and leaves it alone. It also gives one place to find every leftover process of a sandbox
//! (sentry, gofer) and kill it.
//!
//! Both hierarchies are handled: v1 (here: the memory, cpu and cpuacct controllers, each
//! possibly co-mounted) and v2 (production: one directory under `/sys/fs/cgroup/sandcell`).

use crate::{Error, ResourceUsage, Result};
use serde::Serialize;
use std::path::{Path, PathBuf};
use std::time::Duration;

pub const CGROUP_ROOT: &str = "/sys/fs/cgroup";
/// The parent of every sandbox cgroup.
const PARENT: &str = "sandcell";
const CGROUP2_SUPER_MAGIC: i64 = 0x6367_7270;
const CPU_PERIOD_USEC: u64 = 100_000;
const V1_CONTROLLERS: [&str; 3] = ["memory", "cpu", "cpuacct"];

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum CgroupVersion {
    V1,
    V2,
}

impl std::fmt::Display for CgroupVersion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            CgroupVersion::V1 => "v1",
            CgroupVersion::V2 => "v2",
        })
    }
}

/// v2 if `/sys/fs/cgroup` is a cgroup2 mount; v1 if it holds a `memory` hierarchy (v1 or
/// "hybrid", where the controllers are all on v1).
pub fn detect_version() -> Option<CgroupVersion> {
    let root = crate::util::path_cstring(Path::new(CGROUP_ROOT)).ok()?;
    // SAFETY: statfs is plain old data; zeroed is a valid value to be overwritten.
    let mut fs: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: a valid NUL-terminated path and a pointer to a statfs we own.
    if unsafe { libc::statfs(root.as_ptr(), &mut fs) } != 0 {
        return None;
    }
    if fs.f_type as i64 == CGROUP2_SUPER_MAGIC {
        Some(CgroupVersion::V2)
    } else if Path::new(CGROUP_ROOT).join("memory").is_dir() {
        Some(CgroupVersion::V1)
    } else {
        None
    }
}

/// The OCI `linux.cgroupsPath` of a sandbox.
pub fn oci_path(id: &str) -> String {
    format!("/{PARENT}/{id}")
}

#[derive(Debug, Clone)]
pub struct SandboxCgroup {
    version: CgroupVersion,
    /// Every directory of this cgroup (v1: one per distinct hierarchy).
    dirs: Vec<PathBuf>,
    /// The first `own` of `dirs` are the ones we create (v1: memory, cpu, cpuacct).
    own: usize,
    memory_dir: PathBuf,
    cpu_usage_dir: PathBuf,
}

impl SandboxCgroup {
    /// The cgroup of sandbox `id`, whether or not it exists.
    pub fn of(version: CgroupVersion, id: &str) -> SandboxCgroup {
        let root = Path::new(CGROUP_ROOT);
        match version {
            CgroupVersion::V2 => {
                let dir = root.join(PARENT).join(id);
                SandboxCgroup {
                    version,
                    dirs: vec![dir.clone()],
                    memory_dir: dir.clone(),
                    cpu_usage_dir: dir,
                    own: 1,
                }
            }
            CgroupVersion::V1 => {
                // Ours (memory, cpu, cpuacct) first, then every other hierarchy, where runsc
                // makes the sandbox's cgroups itself and may leave them behind if it dies.
                let mut dirs: Vec<PathBuf> = Vec::new();
                let mut canonical: Vec<PathBuf> = Vec::new();
                let mut add = |hierarchy: PathBuf| {
                    // `cpu` and `cpuacct` are often one mount reached through two symlinks.
                    let mount = std::fs::canonicalize(&hierarchy).unwrap_or(hierarchy);
                    let new = !canonical.contains(&mount);
                    if new {
                        canonical.push(mount.clone());
                        dirs.push(mount.join(PARENT).join(id));
                    }
                    new
                };
                let mut own = 0;
                for ctrl in V1_CONTROLLERS {
                    own += usize::from(add(root.join(ctrl)));
                }
                if let Ok(entries) = std::fs::read_dir(root) {
                    let mut others: Vec<PathBuf> = entries.flatten().map(|e| e.path()).collect();
                    others.sort();
                    for other in others {
                        add(other);
                    }
                }
                let under = |ctrl: &str| {
                    let mount =
                        std::fs::canonicalize(root.join(ctrl)).unwrap_or_else(|_| root.join(ctrl));
                    mount.join(PARENT).join(id)
                };
                SandboxCgroup {
                    version,
                    memory_dir: under("memory"),
                    cpu_usage_dir: under("cpuacct"),
                    dirs,
                    own,
                }
            }
        }
    }

    /// Creates the cgroup with a memory limit (no swap) and a CPU quota of `vcpus` cores.
    pub fn create(
        version: CgroupVersion,
        id: &str,
        memory_mib: u32,
        vcpus: u8,
    ) -> Result<SandboxCgroup> {
        let cg = SandboxCgroup::of(version, id);
        let memory = u64::from(memory_mib) << 20;
        let quota = u64::from(vcpus.max(1)) * CPU_PERIOD_USEC;
        let made = match version {
            CgroupVersion::V2 => cg.create_v2(memory, quota),
            CgroupVersion::V1 => cg.create_v1(memory, quota),
        };
        if let Err(e) = made {
            let _ = cg.remove();
            return Err(e);
        }
        Ok(cg)
    }

    fn create_v1(&self, memory: u64, quota: u64) -> Result<()> {
        for dir in &self.dirs[..self.own] {
            mkdir_all(dir)?;
        }
        write(
            &self.memory_dir.join("memory.limit_in_bytes"),
            &memory.to_string(),
        )?;
        // Without swap accounting the file is absent: nothing to limit then.
        let memsw = self.memory_dir.join("memory.memsw.limit_in_bytes");
        if memsw.exists() {
            write(&memsw, &memory.to_string())?;
        }
        for dir in &self.dirs[..self.own] {
            if dir.join("cpu.cfs_quota_us").exists() {
                write(&dir.join("cpu.cfs_period_us"), &CPU_PERIOD_USEC.to_string())?;
                write(&dir.join("cpu.cfs_quota_us"), &quota.to_string())?;
            }
        }
        Ok(())
    }

    fn create_v2(&self, memory: u64, quota: u64) -> Result<()> {
        let root = Path::new(CGROUP_ROOT);
        let parent = root.join(PARENT);
        enable_controllers(root, &["memory", "cpu", "pids"])?;
        mkdir_all(&parent)?;
        enable_controllers(&parent, &["memory", "cpu", "pids"])?;
        let dir = &self.memory_dir;
        mkdir_all(dir)?;
        write(&dir.join("memory.max"), &memory.to_string())?;
        if dir.join("memory.swap.max").exists() {
            write(&dir.join("memory.swap.max"), "0")?;
        }
        write(&dir.join("cpu.max"), &format!("{quota} {CPU_PERIOD_USEC}"))?;
        Ok(())
    }

    pub fn oci_path(&self) -> String {
        // Every dir ends in <PARENT>/<id>.
        let id = self
            .memory_dir
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        oci_path(&id)
    }

    /// v2: the most tasks (threads included) the cgroup may hold.
    pub fn set_pids_max(&self, max: u64) -> Result<()> {
        write(&self.memory_dir.join("pids.max"), &max.to_string())
    }

    /// v2: moves every process of this cgroup (all its threads with it) into `to`. What
    /// they were charged here stays here (memory does not move with a process): for a
    /// process that has touched little yet, such as a pooled VMM before its restore. (A
    /// cgroup v2 cannot be renamed instead: the kernel refuses it on the default hierarchy.)
    pub fn move_processes_to(&self, to: &SandboxCgroup) -> Result<()> {
        for pid in self.pids() {
            write(&to.procs_file(), &pid.to_string())?;
        }
        Ok(())
    }

    /// v2: the file a process writes `0` to in order to move itself into this cgroup.
    pub fn procs_file(&self) -> PathBuf {
        self.memory_dir.join("cgroup.procs")
    }

    pub fn version(&self) -> CgroupVersion {
        self.version
    }

    pub fn usage(&self) -> ResourceUsage {
        let num = |p: PathBuf| read_u64(&p);
        match self.version {
            CgroupVersion::V1 => ResourceUsage {
                memory_bytes: num(self.memory_dir.join("memory.usage_in_bytes")),
                memory_limit_bytes: num(self.memory_dir.join("memory.limit_in_bytes")),
                cpu_usec: num(self.cpu_usage_dir.join("cpuacct.usage")).map(|ns| ns / 1000),
                memory_cache_bytes: keyed(&self.memory_dir.join("memory.stat"), "cache"),
            },
            CgroupVersion::V2 => ResourceUsage {
                memory_bytes: num(self.memory_dir.join("memory.current")),
                memory_limit_bytes: num(self.memory_dir.join("memory.max")),
                cpu_usec: keyed(&self.cpu_usage_dir.join("cpu.stat"), "usage_usec"),
                memory_cache_bytes: keyed(&self.memory_dir.join("memory.stat"), "file"),
            },
        }
    }

    /// How many times the kernel's OOM killer fired in this cgroup.
    pub fn oom_kills(&self) -> u64 {
        let file = match self.version {
            CgroupVersion::V1 => self.memory_dir.join("memory.oom_control"),
            CgroupVersion::V2 => self.memory_dir.join("memory.events"),
        };
        keyed(&file, "oom_kill").unwrap_or(0)
    }

    /// Pids of every process left in the cgroup.
    pub fn pids(&self) -> Vec<u32> {
        let mut pids = Vec::new();
        for dir in &self.dirs {
            if let Ok(text) = std::fs::read_to_string(dir.join("cgroup.procs")) {
                pids.extend(text.lines().filter_map(|l| l.trim().parse::<u32>().ok()));
            }
        }
        pids.sort_unstable();
        pids.dedup();
        pids
    }

    pub fn kill_all(&self) {
        for pid in self.pids() {
            crate::util::kill_pid(pid, libc::SIGKILL);
        }
    }

    /// Kills what is left inside and removes the directories; waits up to a second for
    /// killed processes to leave. Removing a cgroup that does not exist is success.
    pub fn remove(&self) -> Result<()> {
        for dir in &self.dirs {
            if !dir.exists() {
                continue;
            }
            let mut attempt = 0;
            loop {
                match std::fs::remove_dir(dir) {
                    Ok(()) => break,
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => break,
                    Err(e) if attempt < 100 => {
                        let _ = e;
                        self.kill_all();
                        attempt += 1;
                        std::thread::sleep(Duration::from_millis(10));
                    }
                    Err(e) => {
                        return Err(Error::Cgroup {
                            path: dir.clone(),
                            what: "removing (processes left?)".into(),
                            source: e,
                        });
                    }
                }
            }
        }
        Ok(())
    }

    /// Ids of every sandbox cgroup that exists, for the start-up sweep.
    pub fn existing_ids(version: CgroupVersion) -> Vec<String> {
        let parent = match version {
            CgroupVersion::V2 => Path::new(CGROUP_ROOT).join(PARENT),
            CgroupVersion::V1 => Path::new(CGROUP_ROOT).join("memory").join(PARENT),
        };
        let Ok(entries) = std::fs::read_dir(parent) else {
            return Vec::new();
        };
        entries
            .flatten()
            .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|id| crate::validate_id(id))
            .collect()
    }
}

fn mkdir_all(dir: &Path) -> Result<()> {
    std::fs::create_dir_all(dir).map_err(|e| Error::Cgroup {
        path: dir.into(),
        what: "creating".into(),
        source: e,
    })
}

fn write(file: &Path, value: &str) -> Result<()> {
    std::fs::write(file, value).map_err(|e| Error::Cgroup {
        path: file.into(),
        what: format!("writing {value:?}"),
        source: e,
    })
}

fn enable_controllers(dir: &Path, wanted: &[&str]) -> Result<()> {
    let control = dir.join("cgroup.subtree_control");
    let enabled = std::fs::read_to_string(&control).unwrap_or_default();
    let available = std::fs::read_to_string(dir.join("cgroup.controllers")).unwrap_or_default();
    for ctrl in wanted {
        let on = enabled.split_whitespace().any(|c| c == *ctrl);
        let exists = available.split_whitespace().any(|c| c == *ctrl);
        if !on && exists {
            write(&control, &format!("+{ctrl}"))?;
        }
    }
    Ok(())
}

fn read_u64(path: &Path) -> Option<u64> {
    let text = std::fs::read_to_string(path).ok()?;
    let text = text.trim();
    if text == "max" {
        Some(u64::MAX)
    } else {
        text.parse().ok()
    }
}

/// The value of `key` in a "key value" per line file (memory.events, cpu.stat, oom_control).
fn keyed(path: &Path, key: &str) -> Option<u64> {
    let text = std::fs::read_to_string(path).ok()?;
    text.lines().find_map(|l| {
        let mut it = l.split_whitespace();
        (it.next() == Some(key)).then(|| it.next()?.parse().ok())?
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keyed_files_parse() {
        let tmp = tempfile::tempdir().unwrap();
        let f = tmp.path().join("memory.oom_control");
        std::fs::write(&f, "oom_kill_disable 0\nunder_oom 0\noom_kill 2\n").unwrap();
        assert_eq!(keyed(&f, "oom_kill"), Some(2));
        assert_eq!(keyed(&f, "nope"), None);
    }

    #[test]
    fn this_host_has_a_cgroup_hierarchy() {
        assert!(
            detect_version().is_some(),
            "no cgroup v1 or v2 at {CGROUP_ROOT}"
        );
    }

    #[test]
    fn oci_path_matches_dirs() {
        let cg = SandboxCgroup::of(CgroupVersion::V1, "sc-x");
        assert_eq!(cg.oci_path(), "/sandcell/sc-x");
        assert!(cg.memory_dir.ends_with("sandcell/sc-x"));
    }
}
