-- Converts every per-account table into a table hash-partitioned by
-- account_id (`TestDb::partition_by_account`, which sets the partition count
-- and the global tables). A global table (GLOBAL_TABLES in testing.rs) stays
-- as it is, even one with an account_id column: a distributed engine
-- replicates it whole (a reference table).
-- Test harness only: a deployment never runs this.
DO $convert$
DECLARE
    partitions CONSTANT int := current_setting('tollgate.test_hash_partitions')::int;
    global_tables CONSTANT text[] := string_to_array(current_setting('tollgate.test_global_tables'), ',');
    t record;
    d record;
BEGIN
    CREATE TEMP TABLE per_account ON COMMIT DROP AS
        SELECT c.oid AS relid, c.relname::text AS name, c.relname || '_unpartitioned' AS old_name
        FROM pg_class c
        WHERE c.relnamespace = current_schema()::regnamespace AND c.relkind = 'r'
          AND c.relname <> ALL (global_tables)
          AND EXISTS (SELECT FROM pg_attribute a
                      WHERE a.attrelid = c.oid AND a.attname = 'account_id' AND NOT a.attisdropped);
    CREATE TEMP TABLE foreign_keys ON COMMIT DROP AS
        SELECT c.relname::text AS on_table, k.conname::text AS name, pg_get_constraintdef(k.oid) AS def
        FROM pg_constraint k JOIN pg_class c ON c.oid = k.conrelid
        WHERE k.contype = 'f'
          AND (k.conrelid IN (SELECT relid FROM per_account) OR k.confrelid IN (SELECT relid FROM per_account));
    CREATE TEMP TABLE unique_keys ON COMMIT DROP AS
        SELECT c.relname::text AS on_table, k.conname::text AS name, pg_get_constraintdef(k.oid) AS def
        FROM pg_constraint k JOIN pg_class c ON c.oid = k.conrelid
        WHERE k.contype IN ('p', 'u', 'x') AND k.conrelid IN (SELECT relid FROM per_account);
    CREATE TEMP TABLE other_indexes ON COMMIT DROP AS
        SELECT pg_get_indexdef(x.indexrelid) AS def
        FROM pg_index x
        WHERE x.indrelid IN (SELECT relid FROM per_account)
          AND NOT EXISTS (SELECT FROM pg_constraint k
                          WHERE k.conindid = x.indexrelid AND k.conrelid = x.indrelid
                            AND k.contype IN ('p', 'u', 'x'));
    CREATE TEMP TABLE triggers ON COMMIT DROP AS
        SELECT pg_get_triggerdef(g.oid) AS def
        FROM pg_trigger g
        WHERE g.tgrelid IN (SELECT relid FROM per_account) AND NOT g.tgisinternal;

    FOR d IN SELECT * FROM foreign_keys LOOP
        EXECUTE format('ALTER TABLE %I DROP CONSTRAINT %I', d.on_table, d.name);
    END LOOP;
    FOR t IN SELECT * FROM per_account ORDER BY name LOOP
        EXECUTE format('ALTER TABLE %I RENAME TO %I', t.name, t.old_name);
        EXECUTE format('CREATE TABLE %I (LIKE %I INCLUDING ALL EXCLUDING INDEXES) PARTITION BY HASH (account_id)',
                       t.name, t.old_name);
        FOR i IN 0 .. partitions - 1 LOOP
            EXECUTE format('CREATE TABLE %I PARTITION OF %I FOR VALUES WITH (MODULUS %s, REMAINDER %s)',
                           t.name || '_p' || i, t.name, partitions, i);
        END LOOP;
        EXECUTE format('INSERT INTO %I SELECT * FROM %I', t.name, t.old_name);
        EXECUTE format('DROP TABLE %I', t.old_name);
    END LOOP;
    FOR d IN SELECT * FROM unique_keys LOOP
        EXECUTE format('ALTER TABLE %I ADD CONSTRAINT %I %s', d.on_table, d.name, d.def);
    END LOOP;
    FOR d IN SELECT * FROM other_indexes LOOP
        EXECUTE d.def;
    END LOOP;
    FOR d IN SELECT * FROM foreign_keys LOOP
        EXECUTE format('ALTER TABLE %I ADD CONSTRAINT %I %s', d.on_table, d.name, d.def);
    END LOOP;
    FOR d IN SELECT * FROM triggers LOOP
        EXECUTE d.def;
    END LOOP;
END
$convert$;
