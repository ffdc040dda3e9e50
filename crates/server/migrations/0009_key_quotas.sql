-- Version 9: per-key quotas beside max_sandboxes (keys/quota.rs). Every quota column,
-- max_sandboxes included from this version on, reads: NULL = the daemon's default for that
-- quota (`sandcell serve --default-max-...`; admin keys: no limit), -1 = no limit, N >= 0 =
-- at most N. Keys made before this version without --max-sandboxes therefore get the
-- daemon's default sandbox limit (`sandcell keys update --max-sandboxes unlimited` restores
-- the old behaviour for one key).
ALTER TABLE api_keys ADD COLUMN max_memory_mib INTEGER;  -- memory of its running sandboxes
ALTER TABLE api_keys ADD COLUMN max_disk_mib INTEGER;    -- disks of its live sandboxes, paused memory
ALTER TABLE api_keys ADD COLUMN max_builds INTEGER;      -- template builds at once
ALTER TABLE api_keys ADD COLUMN max_upload_mib INTEGER;  -- uploaded build archives kept
