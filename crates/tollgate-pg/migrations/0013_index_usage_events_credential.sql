-- Credential audits list the events a key reported; without this index that
-- is a scan of the whole usage history.
CREATE INDEX tollgate_usage_events_credential
    ON tollgate_usage_events (credential_id);
