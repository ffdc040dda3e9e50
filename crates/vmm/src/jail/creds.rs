//! The jail's credentials and limits: rlimits, then an unprivileged uid/gid with no
//! capabilities and `no_new_privs`.

use super::JailError;
use sandcell_proto::vmm::JailSpec;

fn set_limit(resource: libc::__rlimit_resource_t, value: u64) -> Result<(), JailError> {
    let limit = libc::rlimit {
        rlim_cur: value,
        rlim_max: value,
    };
    // SAFETY: `limit` is a valid rlimit that outlives the call; the result is checked.
    if unsafe { libc::setrlimit(resource, &limit) } != 0 {
        return Err(JailError::sys("setrlimit"));
    }
    Ok(())
}

/// Step 3: hard and soft limits alike, so nothing in the process can raise them again.
pub(super) fn limit(spec: &JailSpec) -> Result<(), JailError> {
    set_limit(libc::RLIMIT_NOFILE, spec.max_open_files)?;
    set_limit(libc::RLIMIT_FSIZE, spec.max_file_bytes)?;
    // Counted per real uid: the jail's uid is this VMM's alone, so this bounds its threads.
    set_limit(libc::RLIMIT_NPROC, spec.max_threads)?;
    // A write past RLIMIT_FSIZE raises SIGXFSZ, which kills by default: ignored, the write
    // fails with EFBIG instead and the guest sees an I/O error on its disk.
    // SAFETY: installs the SIG_IGN disposition; no handler code runs.
    if unsafe { libc::signal(libc::SIGXFSZ, libc::SIG_IGN) } == libc::SIG_ERR {
        return Err(JailError::sys("ignoring SIGXFSZ"));
    }
    Ok(())
}

/// Step 4.
pub(super) fn drop_privileges(uid: u32, gid: u32) -> Result<(), JailError> {
    // The bounding set first (it takes CAP_SETPCAP, gone after the uid change): no
    // capability can come back through an exec either. EINVAL past the last capability.
    for cap in 0..64 {
        // SAFETY: PR_CAPBSET_DROP takes an integer capability number.
        if unsafe { libc::prctl(libc::PR_CAPBSET_DROP, cap, 0, 0, 0) } != 0 {
            let e = std::io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::EINVAL) {
                break;
            }
            return Err(JailError::Sys {
                what: "dropping the capability bounding set",
                source: e,
            });
        }
    }
    // SAFETY: zero groups, a null list; the result is checked.
    if unsafe { libc::setgroups(0, std::ptr::null()) } != 0 {
        return Err(JailError::sys("setgroups"));
    }
    // SAFETY: plain integers; the results are checked.
    if unsafe { libc::setresgid(gid, gid, gid) } != 0 {
        return Err(JailError::sys("setresgid"));
    }
    // SAFETY: as above.
    if unsafe { libc::setresuid(uid, uid, uid) } != 0 {
        return Err(JailError::sys("setresuid"));
    }
    clear_capabilities()?;
    // SAFETY: PR_SET_NO_NEW_PRIVS takes the integer 1.
    if unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) } != 0 {
        return Err(JailError::sys("PR_SET_NO_NEW_PRIVS"));
    }
    Ok(())
}

/// The uid change cleared the permitted, effective and ambient sets; the inheritable set
/// survives it (empty as the daemon runs, but not trusted to be): all three set to empty.
fn clear_capabilities() -> Result<(), JailError> {
    #[repr(C)]
    struct Header {
        version: u32,
        pid: i32,
    }
    #[repr(C)]
    #[derive(Clone, Copy)]
    struct Data {
        effective: u32,
        permitted: u32,
        inheritable: u32,
    }
    // _LINUX_CAPABILITY_VERSION_3: two Data words (64 capabilities).
    let mut header = Header {
        version: 0x2008_0522,
        pid: 0,
    };
    let data = [Data {
        effective: 0,
        permitted: 0,
        inheritable: 0,
    }; 2];
    // SAFETY: capset reads one header and two data structs laid out as the kernel's
    // (repr(C), the v3 layout); both outlive the call. The result is checked.
    let rc = unsafe { libc::syscall(libc::SYS_capset, &mut header, data.as_ptr()) };
    if rc != 0 {
        return Err(JailError::sys("capset"));
    }
    Ok(())
}

/// Every capability set of this process is empty (read back from the jail's /proc).
pub(super) fn verify() -> Result<(), JailError> {
    let status = std::fs::read_to_string("/proc/self/status").map_err(|source| JailError::Sys {
        what: "reading /proc/self/status",
        source,
    })?;
    let left: Vec<&str> = status
        .lines()
        .filter(|l| {
            ["CapInh:", "CapPrm:", "CapEff:", "CapBnd:", "CapAmb:"]
                .iter()
                .any(|p| l.starts_with(p))
        })
        .filter(|l| {
            l.split_whitespace()
                .nth(1)
                .is_some_and(|v| !v.trim_start_matches('0').is_empty())
        })
        .collect();
    if left.is_empty() {
        Ok(())
    } else {
        Err(JailError::CapabilitiesLeft(left.join(", ")))
    }
}
