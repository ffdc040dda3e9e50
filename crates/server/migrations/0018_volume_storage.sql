-- Version 18: a volume in the key's own bucket ("bring your own bucket"): its endpoint,
-- bucket, region, prefix and path style as JSON, its credentials sealed with the secrets
-- key ring (`credentials`: v1.<kid>.<nonce>.<ciphertext>); NULL for a volume in the
-- operator's bucket. Never returned by the API with its credentials (volumes/storage.rs).
ALTER TABLE volumes ADD COLUMN storage TEXT;
