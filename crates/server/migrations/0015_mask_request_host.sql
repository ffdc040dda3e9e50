-- Version 14: E2B's `network.maskRequestHost`: the Host header requests to the sandbox's
-- ports (other than envd's) arrive with, `${PORT}` replaced by the port (http/proxy.rs).
ALTER TABLE sandbox_networks ADD COLUMN mask_request_host TEXT;
