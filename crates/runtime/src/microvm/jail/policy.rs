//! Whether this runtime's VMMs are jailed: what `SANDCELL_VMM_JAIL` asks for, and what the
//! host allows (cgroup v2, a root that pivot_root can leave).

use super::{DEFAULT_UID_BASE, ENABLE_ENV, JailError, UID_BASE_ENV, UID_COUNT};
use crate::cgroup::CgroupVersion;

/// Whether VMMs are jailed, and from which uid.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JailPolicy {
    pub uid_base: u32,
}

/// What `SANDCELL_VMM_JAIL` asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JailSetting {
    /// `0`: no jail.
    Off,
    /// `1`: every VMM jailed; a create whose jail cannot be made fails.
    Required(JailPolicy),
    /// Unset or empty: jailed when the host can ([`JailSetting::resolve`]).
    Auto(JailPolicy),
}

/// What the jail needs of the host, as found at start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HostSupport {
    /// cgroup v2 on /sys/fs/cgroup: the VMM's cgroup and its limits.
    pub cgroup_v2: bool,
    /// `/` is a mount with a parent: pivot_root (the jail's step 2) refuses a namespace's
    /// own root mount (an initramfs's rootfs when nothing was mounted over it).
    pub pivotable_root: bool,
}

impl HostSupport {
    pub fn probe() -> HostSupport {
        let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        HostSupport {
            cgroup_v2: crate::cgroup::detect_version() == Some(CgroupVersion::V2),
            pivotable_root: root_has_parent(&mountinfo),
        }
    }
}

/// Whether `/` in `mountinfo` (proc(5)'s format) is a mount whose parent is another mount,
/// as pivot_root requires of the caller's root (the kernel's `mnt_has_parent`): not the
/// namespace's own root (its parent is itself), and a mount at all (a chroot into a plain
/// directory has none at `/`).
fn root_has_parent(mountinfo: &str) -> bool {
    mountinfo.lines().any(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        matches!(fields.as_slice(), [id, parent, _, _, "/", ..] if id != parent)
    })
}

impl JailSetting {
    /// From `SANDCELL_VMM_JAIL` and `SANDCELL_VMM_UID_BASE`.
    pub fn from_env() -> Result<JailSetting, JailError> {
        let var = |name| std::env::var(name).ok().filter(|v| !v.is_empty());
        JailSetting::parse(var(ENABLE_ENV), var(UID_BASE_ENV))
    }

    fn parse(enable: Option<String>, base: Option<String>) -> Result<JailSetting, JailError> {
        let required = match enable.as_deref() {
            Some("0") => return Ok(JailSetting::Off),
            None => false,
            Some("1") => true,
            Some(other) => {
                return Err(JailError::BadSetting {
                    var: ENABLE_ENV,
                    value: other.into(),
                    why: "1 requires the jail, 0 turns it off, nothing jails wherever the host allows",
                });
            }
        };
        let policy = JailPolicy::parse_base(base)?;
        Ok(match required {
            true => JailSetting::Required(policy),
            false => JailSetting::Auto(policy),
        })
    }

    /// The policy the runtime runs with on `host`: `Auto` jails only where the host has
    /// what the jail needs, and says why not otherwise (the caller logs it).
    pub fn resolve(self, host: HostSupport) -> (Option<JailPolicy>, Option<&'static str>) {
        match self {
            JailSetting::Off => (None, Some("SANDCELL_VMM_JAIL=0")),
            JailSetting::Required(p) => (Some(p), None),
            JailSetting::Auto(_) if !host.cgroup_v2 => (
                None,
                Some("the host has no cgroup v2 on /sys/fs/cgroup (the jail's limits live there)"),
            ),
            JailSetting::Auto(_) if !host.pivotable_root => (
                None,
                Some("the root is an initramfs, which pivot_root cannot leave"),
            ),
            JailSetting::Auto(p) => (Some(p), None),
        }
    }
}

impl JailPolicy {
    fn parse_base(base: Option<String>) -> Result<JailPolicy, JailError> {
        let uid_base = match base {
            None => DEFAULT_UID_BASE,
            Some(v) => v
                .parse::<u32>()
                .ok()
                // Above the system's and the usual login users' ranges, and a whole range
                // below the 32-bit limit (u32::MAX is "no uid" to the kernel).
                .filter(|b| *b >= 10_000 && b.checked_add(UID_COUNT).is_some())
                .ok_or(JailError::BadSetting {
                    var: UID_BASE_ENV,
                    value: v,
                    why: "a uid of at least 10000 with 65536 free uids above it",
                })?,
        };
        Ok(JailPolicy { uid_base })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_jail_is_on_where_the_host_allows_unless_turned_off_and_bad_settings_are_refused() {
        let s = |v: &str| Some(v.to_string());
        let default = JailPolicy {
            uid_base: DEFAULT_UID_BASE,
        };
        assert_eq!(
            JailSetting::parse(None, None).unwrap(),
            JailSetting::Auto(default)
        );
        assert_eq!(
            JailSetting::parse(s("0"), s("junk")).unwrap(),
            JailSetting::Off
        );
        assert_eq!(
            JailSetting::parse(s("1"), None).unwrap(),
            JailSetting::Required(default)
        );
        assert_eq!(
            JailSetting::parse(s("1"), s("200000")).unwrap(),
            JailSetting::Required(JailPolicy { uid_base: 200_000 })
        );
        let able = HostSupport {
            cgroup_v2: true,
            pivotable_root: true,
        };
        let v1 = HostSupport {
            cgroup_v2: false,
            ..able
        };
        let initramfs = HostSupport {
            pivotable_root: false,
            ..able
        };
        assert_eq!(
            JailSetting::Auto(default).resolve(able),
            (Some(default), None)
        );
        for host in [v1, initramfs] {
            let (policy, why) = JailSetting::Auto(default).resolve(host);
            assert_eq!(policy, None);
            assert!(why.is_some());
        }
        // Required is required: its creates fail where the jail cannot be made.
        assert_eq!(JailSetting::Required(default).resolve(v1).0, Some(default));
        assert_eq!(JailSetting::Off.resolve(able).0, None);
        for (enable, base) in [
            ("yes", None),
            ("1", s("0")),
            ("1", s("4294967000")),
            ("1", s("x")),
        ] {
            let err = JailSetting::parse(s(enable), base).expect_err("refused");
            assert!(matches!(err, JailError::BadSetting { .. }), "{err}");
        }
    }

    #[test]
    fn an_initramfs_root_is_told_from_a_mounted_one() {
        let initramfs = "1 1 0:2 / / rw - rootfs rootfs rw\n20 1 0:19 / /proc rw - proc proc rw\n";
        assert!(!root_has_parent(initramfs));
        let disk = "25 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw\n\
                    40 25 0:5 / /run rw - tmpfs tmpfs rw\n";
        assert!(root_has_parent(disk));
        // Chrooted into a bind of the initramfs (the nested harness's L1): a mount with a
        // parent, which pivot_root accepts.
        assert!(root_has_parent("30 1 0:2 / / rw - rootfs rootfs rw\n"));
        // Chrooted into a plain directory: no mount at `/`.
        assert!(!root_has_parent("30 1 0:2 / /mnt rw - ext4 /dev/sda1 rw\n"));
        // This host.
        let here = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
        assert!(root_has_parent(&here), "{here}");
    }
}
