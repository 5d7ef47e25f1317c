-- Consolidation settles several leases into one fresh lease; the sources end
-- in their own terminal state so that history shows why they closed.
ALTER TABLE tollgate_leases DROP CONSTRAINT tollgate_leases_state_check;
ALTER TABLE tollgate_leases
    ADD CONSTRAINT tollgate_leases_state_check
    CHECK (state IN ('active', 'released', 'reclaimed', 'consolidated'));
