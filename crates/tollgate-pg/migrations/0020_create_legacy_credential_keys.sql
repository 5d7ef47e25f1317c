-- Credential keys name their account from this version on:
-- tgk_{account_id}_{64 lowercase hex}. A server looks a presented key up
-- under the account it names (account_id and key_hash by equality), so
-- verifying a key touches one account, like every other request.
--
-- Keys issued before carry no account: tgk_{64 lowercase hex}. They keep
-- verifying through this directory, which leads a legacy key's hash to its
-- account; the credential is then read on that account. It is filled here,
-- once, from every credential that exists now, all of which have legacy
-- keys, and it is read-only from then on: no statement of the server writes
-- it, and new keys never enter it. A key issued by a server older than this
-- migration after it ran is not in it and does not verify; upgrade every
-- server before issuing credentials again (docs/upgrading.md).
--
-- On an engine that distributes tables by account_id (Citus), this is a
-- small reference table, replicated to every node and never written after
-- this migration, so its lookup by key hash is local wherever it runs. It
-- therefore has no foreign key to the distributed accounts table.
--
-- The lock keeps credentials from being inserted while the directory is
-- copied, so none issued before the commit is missed.
LOCK TABLE tollgate_credentials IN SHARE MODE;

CREATE TABLE tollgate_legacy_credential_keys (
    key_hash   BYTEA PRIMARY KEY,
    account_id TEXT NOT NULL
);

INSERT INTO tollgate_legacy_credential_keys (key_hash, account_id)
SELECT c.key_hash, c.account_id FROM tollgate_credentials c;
