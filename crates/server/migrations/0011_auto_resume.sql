-- Version 11: auto-resume (E2B's `autoResume: {"enabled": true}`, http/wake.rs). NULL: a
-- paused sandbox stays paused until a connect or resume; a number: a request for it through
-- the proxy (its envd, its ports) resumes it with this timeout in seconds (E2B: the timeout
-- it was created with, at least 5 minutes), decided at create.
ALTER TABLE sandbox_lifecycle ADD COLUMN auto_resume_timeout_secs INTEGER;
