//! The states of a sandbox and the one table of the moves between them. Every change of the
//! `state` column goes through [`crate::store::Db::transition`] (or the create/running writes
//! of `store/`), which refuses a move this table does not allow.
//!
//! ```text
//!   creating ──start ok──▶ running ──kill, timeout, key revoked──▶ killing ──▶ killed
//!      │                   │  ▲   │                                  ▲  │
//!      │                   │  │   └──pause──▶ pausing ──▶ paused ────┤  │
//!      │                   │  └───────────── resuming ◀──resume──┘   │  │
//!      │                   │                                          │  ▼
//!      └──────failed───────┴────ended by itself, lost──────────────▶ error
//! ```
//!
//! Pausing, paused and resuming: snapshots/pause.rs (a paused sandbox keeps its snapshot on disk).
//! `killed` and `error` are final. Every non-final state holds host resources and counts
//! against the key's limit.

/// A sandbox's lifecycle state as stored in the `state` column.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum State {
    Creating,
    Running,
    Pausing,
    Paused,
    Resuming,
    Killing,
    Killed,
    Error,
}

impl State {
    pub const ALL: [State; 8] = [
        State::Creating,
        State::Running,
        State::Pausing,
        State::Paused,
        State::Resuming,
        State::Killing,
        State::Killed,
        State::Error,
    ];

    /// States that hold host resources and count against a key's limit.
    pub const LIVE: [State; 6] = [
        State::Creating,
        State::Running,
        State::Pausing,
        State::Paused,
        State::Resuming,
        State::Killing,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            State::Creating => "creating",
            State::Running => "running",
            State::Pausing => "pausing",
            State::Paused => "paused",
            State::Resuming => "resuming",
            State::Killing => "killing",
            State::Killed => "killed",
            State::Error => "error",
        }
    }

    pub fn parse(s: &str) -> Option<State> {
        State::ALL.into_iter().find(|st| st.as_str() == s)
    }

    pub fn is_final(self) -> bool {
        matches!(self, State::Killed | State::Error)
    }

    /// Whether the API shows the sandbox by its id (GET, DELETE, connect): not before its
    /// create answered, and not once a kill began (the SDK's "killed" is "not found"; a
    /// sandbox whose agent is already gone must not still answer 200 while it is removed).
    pub fn is_addressable(self) -> bool {
        !self.is_final() && !matches!(self, State::Creating | State::Killing)
    }

    /// Whether a sandbox may move from `self` to `to`.
    pub fn can_move_to(self, to: State) -> bool {
        use State::*;
        matches!(
            (self, to),
            (Creating, Running | Killing | Error)
                | (Running, Pausing | Killing | Error)
                | (Pausing, Paused | Running | Killing | Error)
                | (Paused, Resuming | Killing | Error)
                | (Resuming, Running | Paused | Killing | Error)
                | (Killing, Killed | Error)
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn final_states_are_final_and_names_round_trip() {
        for s in State::ALL {
            assert_eq!(State::parse(s.as_str()), Some(s));
            if s.is_final() {
                assert!(State::ALL.iter().all(|t| !s.can_move_to(*t)), "{s:?}");
                assert!(!State::LIVE.contains(&s));
            } else {
                assert!(s.can_move_to(State::Error), "{s:?} can fail");
                assert!(State::LIVE.contains(&s));
            }
        }
        assert!(!State::Creating.can_move_to(State::Killed), "killing first");
        assert!(!State::Killed.can_move_to(State::Running));
        assert_eq!(State::parse("zombie"), None);
    }
}
