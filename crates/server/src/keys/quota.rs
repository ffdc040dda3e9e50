//! The quotas in force for a key: what its row says (store/keys.rs), the daemon's defaults
//! where it says `default` (`sandcell serve --default-max-...`), and no limit for an admin
//! key's defaults (the operator's key must be able to clean up a full host).
//!
//! Sandboxes, memory and disk are checked on every create, restore, fork and resume
//! (sandboxes/admission.rs); builds and uploads are for the template builder.

use crate::store::KeyRow;
use crate::store::keys::Limit;

/// Defaults of a fresh key: room for a team's everyday work on one host, not for taking the
/// whole host (a fresh key must not be able to make the daemon fall over).
pub const DEFAULT_MAX_SANDBOXES: u64 = 20;
pub const DEFAULT_MAX_MEMORY_MIB: u64 = 32 * 1024;
/// Twenty sandboxes of E2B's 10 GiB disk.
pub const DEFAULT_MAX_DISK_MIB: u64 = 200 * 1024;
pub const DEFAULT_MAX_BUILDS: u64 = 2;
pub const DEFAULT_MAX_UPLOAD_MIB: u64 = 16 * 1024;

/// The daemon's defaults for keys whose quota is `default`; `None` is no limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QuotaDefaults {
    pub sandboxes: Option<u64>,
    pub memory_mib: Option<u64>,
    pub disk_mib: Option<u64>,
    pub builds: Option<u64>,
    pub upload_mib: Option<u64>,
}

impl Default for QuotaDefaults {
    fn default() -> Self {
        QuotaDefaults {
            sandboxes: Some(DEFAULT_MAX_SANDBOXES),
            memory_mib: Some(DEFAULT_MAX_MEMORY_MIB),
            disk_mib: Some(DEFAULT_MAX_DISK_MIB),
            builds: Some(DEFAULT_MAX_BUILDS),
            upload_mib: Some(DEFAULT_MAX_UPLOAD_MIB),
        }
    }
}

/// A key's quotas in force; `None` is no limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Quotas {
    pub sandboxes: Option<u64>,
    pub memory_mib: Option<u64>,
    pub disk_mib: Option<u64>,
    pub builds: Option<u64>,
    pub upload_mib: Option<u64>,
}

/// The quotas in force for `key` on a daemon with `defaults`.
pub fn quotas_of(key: &KeyRow, defaults: &QuotaDefaults) -> Quotas {
    let d = |default: Option<u64>| if key.is_admin { None } else { default };
    let q = &key.quotas;
    Quotas {
        sandboxes: q.sandboxes.resolve(d(defaults.sandboxes)),
        memory_mib: q.memory_mib.resolve(d(defaults.memory_mib)),
        disk_mib: q.disk_mib.resolve(d(defaults.disk_mib)),
        builds: q.builds.resolve(d(defaults.builds)),
        upload_mib: q.upload_mib.resolve(d(defaults.upload_mib)),
    }
}

/// A `sandcell serve --default-max-...` value: a number, or `unlimited`/`none` (`None`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DefaultLimit(pub Option<u64>);

impl std::str::FromStr for DefaultLimit {
    type Err = String;

    fn from_str(s: &str) -> Result<DefaultLimit, String> {
        match s.parse::<Limit>()? {
            Limit::Max(n) => Ok(DefaultLimit(Some(n))),
            Limit::Unlimited => Ok(DefaultLimit(None)),
            Limit::Default => Err("a default cannot be `default`: a number or `unlimited`".into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::keys::KeyQuotas;

    fn key(is_admin: bool, quotas: KeyQuotas) -> KeyRow {
        KeyRow {
            id: "key_1".into(),
            name: "k".into(),
            key_prefix: "e2b_".into(),
            is_admin,
            quotas,
            created_at: 0,
            revoked_at: None,
        }
    }

    #[test]
    fn defaults_apply_to_ordinary_keys_only_and_explicit_values_win() {
        let d = QuotaDefaults::default();
        let fresh = quotas_of(&key(false, KeyQuotas::default()), &d);
        assert_eq!(fresh.sandboxes, Some(DEFAULT_MAX_SANDBOXES));
        assert_eq!(fresh.memory_mib, Some(DEFAULT_MAX_MEMORY_MIB));
        assert_eq!(fresh.builds, Some(DEFAULT_MAX_BUILDS));
        let admin = quotas_of(&key(true, KeyQuotas::default()), &d);
        assert_eq!(admin.sandboxes, None);
        assert_eq!(admin.memory_mib, None);
        let set = KeyQuotas {
            sandboxes: Limit::Max(3),
            memory_mib: Limit::Unlimited,
            ..KeyQuotas::default()
        };
        let q = quotas_of(&key(false, set), &d);
        assert_eq!(q.sandboxes, Some(3));
        assert_eq!(q.memory_mib, None);
        assert_eq!(q.disk_mib, Some(DEFAULT_MAX_DISK_MIB));
        // An admin key given a limit has it.
        assert_eq!(quotas_of(&key(true, set), &d).sandboxes, Some(3));
        assert_eq!(
            quotas_of(&key(false, KeyQuotas::UNLIMITED), &d).disk_mib,
            None
        );
    }

    #[test]
    fn limits_parse_from_flags() {
        assert_eq!("12".parse::<Limit>(), Ok(Limit::Max(12)));
        assert_eq!("unlimited".parse::<Limit>(), Ok(Limit::Unlimited));
        assert_eq!("default".parse::<Limit>(), Ok(Limit::Default));
        assert!("-3".parse::<Limit>().is_err());
        assert!("lots".parse::<Limit>().is_err());
        assert_eq!("none".parse::<DefaultLimit>(), Ok(DefaultLimit(None)));
        assert_eq!("7".parse::<DefaultLimit>(), Ok(DefaultLimit(Some(7))));
        assert!("default".parse::<DefaultLimit>().is_err());
    }
}
