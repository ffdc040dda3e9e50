-- Version 10: E2B's `autoPauseMemory: false` (lifecycle on_timeout pause, mode filesystem):
-- the auto-pause at the timeout saves the sandbox's files only (snapshots/pause.rs).
-- 0 (the default, and every row before this version): the pause keeps the memory.
ALTER TABLE sandbox_lifecycle ADD COLUMN auto_pause_files_only INTEGER NOT NULL DEFAULT 0;
