//! The store conformance suite, written once and run against every backend.
//!
//! Each case is a generic async function over a [`StoreFactory`]; the
//! [`conformance_suite!`] macro turns every case into a `#[tokio::test]` in the
//! crate that instantiates it. A backend that passes this suite keeps the same
//! contract as every other one, rule for rule. Every step of every case is followed
//! by an exact ledger check: the expected value of each counter, and all three
//! conservation equations.

pub mod cancellation;
pub mod cases;
pub mod support;

use std::future::Future;

use tollgate_core::GrantPolicy;
use tollgate_store::Store;

/// Makes fresh, empty stores for the suite.
pub trait StoreFactory: Sync {
    type Store: Store + 'static;

    /// A new store with nothing in it, running `policy`.
    fn create(&self, policy: GrantPolicy) -> impl Future<Output = Self::Store> + Send;
}

/// Instantiates every conformance case as a `#[tokio::test]` for `$factory`, an
/// expression of a type implementing [`StoreFactory`].
#[macro_export]
macro_rules! conformance_suite {
    ($factory:expr) => {
        $crate::conformance_suite!(@cases $factory;
            nanosecond_ttl_and_grace,
            ttl_above_max_is_clamped_exactly,
            ttl_zero_and_negative_are_refused_without_debit,
            acquire_before_the_epoch_and_at_both_domain_endpoints,
            expiry_past_max_is_refused_without_debit,
            reclaim_boundary_is_exact_to_the_nanosecond,
            release_and_usage_inside_grace_then_refused_at_the_boundary,
            grace_zero_makes_the_expiry_the_boundary,
            grace_longer_than_the_domain_is_never_due,
            deadline_past_max_is_not_due_even_at_max,
            release_refusals_wrong_capability_twice_and_after_reclaim,
            consolidation_carries_units_exactly,
            consolidation_is_refused_atomically,
            reclaim_is_bounded_in_account_order_and_idempotent,
            reclaim_settles_the_most_overdue_accounts_leases_together,
            the_lease_summary_counts_active_and_due_leases_of_every_account,
            ingest_classifies_a_mixed_batch,
            duplicate_detection_precedes_validation,
            rejected_request_id_is_reusable,
            zero_and_maximum_units,
            funding_must_be_complete,
            usage_beyond_the_grant_is_billed_as_overage,
            refused_batch_applies_nothing_in_both_orders,
            credential_activity_moves_only_on_accepted_events,
            stale_fence_cannot_report_after_settlement,
            accounts_and_credits,
            credential_lifecycle,
            keyed_acquire_replays_once_and_refuses_reuse,
            keyed_release_and_consolidate_replay_without_settling_twice,
            keyed_credential_issue_and_revoke_replay,
            refused_keyed_requests_record_nothing,
            expired_idempotency_records_are_purged_in_bounded_batches,
            a_lease_under_another_account_is_not_found_and_nothing_changes,
            a_credential_under_another_account_is_not_found_and_stays_valid,
            a_key_whose_account_part_was_altered_is_unknown,
            accounts_are_listed_in_id_order_page_by_page, leases_are_listed_by_id_and_filtered_by_state, credentials_and_credits_are_listed_by_id, cursors_are_refused_across_listings_accounts_and_filters, rows_inserted_between_pages_are_neither_skipped_nor_repeated, dimensions_are_validated_after_duplicates, usage_windows_are_exact_to_the_nanosecond, usage_before_the_epoch, usage_groups_by_credential_lease_funding_and_dimension, usage_refusals, usage_exports_page_in_order, usage_totals_are_the_events_across_whole_and_partial_hours, journal_records_each_kind_with_its_ids_in_sequence, no_entry_for_an_operation_that_changes_nothing_or_is_refused, keyed_replays_write_no_new_entry, reclaim_writes_one_entry_per_account_and_pages_follow_the_sequence,
            a_balance_rule_fires_once_per_crossing_and_recovers, percent_and_overage_rules_cross_at_their_bounds, a_rule_judges_only_changes_after_its_creation, credits_and_reclaims_reach_the_endpoints_that_want_them, a_refusal_rule_fires_once_until_available_rises, each_delivery_attempt_is_claimed_once_and_recorded_by_its_claim, a_rotated_secret_signs_until_its_overlap_ends, rules_and_endpoints_are_validated_bounded_and_deleted, the_delivery_log_pages_in_creation_order, a_claim_passes_over_the_endpoints_it_skips, refused_and_rolled_back_changes_emit_nothing,
        );
    };
    (@cases $factory:expr; $($case:ident),* $(,)?) => {
        $(
            #[tokio::test]
            async fn $case() {
                $crate::cases::$case(&$factory).await;
            }
        )*
    };
}

#[cfg(test)]
mod tests {
    /// Every public case, as its source declares it.
    fn declared_cases() -> Vec<&'static str> {
        [
            include_str!("cases.rs"),
            include_str!("cases/idempotent.rs"),
            include_str!("cases/listings.rs"),
            include_str!("cases/scoped.rs"),
            include_str!("cases/usage_queries.rs"),
            include_str!("cases/journal.rs"),
            include_str!("cases/outbox.rs"),
            include_str!("cases/summary.rs"),
        ]
        .into_iter()
        .flat_map(str::lines)
        .filter_map(|line| line.strip_prefix("pub async fn "))
        .filter(|rest| rest.contains("<F: StoreFactory>"))
        .filter_map(|rest| rest.split('<').next())
        .collect()
    }

    /// A case that `conformance_suite!` does not list never runs on any
    /// store, and nothing else would say so.
    #[test]
    fn every_public_case_is_registered_in_the_suite() {
        let suite = include_str!("lib.rs");
        let listed = suite.split("(@cases $factory;").nth(1).and_then(|rest| rest.split(");").next());
        let listed: Vec<&str> = listed.expect("the case list").split(',').map(str::trim).collect();
        let cases = declared_cases();
        assert!(cases.len() >= 30, "the case declarations changed shape: {cases:?}");
        let missing: Vec<&str> = cases.iter().copied().filter(|case| !listed.contains(case)).collect();
        assert!(missing.is_empty(), "cases not listed in conformance_suite!: {missing:?}");
    }
}
