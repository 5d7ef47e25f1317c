(** * Tollgate.Audit

    Collects every [Theorem] and [Corollary] of the two proof files into one
    tuple per file and prints the assumptions behind each tuple.  The assumptions
    of a tuple are the union of those of its parts, and one traversal is much
    faster than one per theorem.  [formal/check] requires each answer to be
    "Closed under the global context": a proof that leaned on an unproved
    statement would otherwise look the same as a checked one.  [formal/check]
    also fails if a theorem of the sources is missing from these tuples. *)

From Tollgate Require LeaseTiming Conservation.

Definition lease_timing_theorems := (
  LeaseTiming.enc_formula,
  LeaseTiming.dec_enc,
  LeaseTiming.enc_dec,
  LeaseTiming.dec_submicro_range,
  LeaseTiming.lex_lt_iff_enc_lt,
  LeaseTiming.lex_le_iff_enc_le,
  LeaseTiming.dec_order,
  LeaseTiming.MIN_NS_seconds,
  LeaseTiming.MAX_NS_seconds,
  LeaseTiming.domain_endpoints,
  LeaseTiming.domain_rectangle,
  LeaseTiming.dec_domain,
  LeaseTiming.cutoff_equiv,
  LeaseTiming.cutoff_equiv_domain,
  LeaseTiming.cutoff_none_nothing_due,
  LeaseTiming.cutoff_some_in_domain,
  LeaseTiming.beyond_max_never_due,
  LeaseTiming.beyond_max_cutoff_before_expiry,
  LeaseTiming.eff_pos,
  LeaseTiming.eff_le_max,
  LeaseTiming.eff_le_ttl,
  LeaseTiming.eff_exact,
  LeaseTiming.eff_clamped,
  LeaseTiming.expiry_after_now,
  LeaseTiming.expiry_representable,
  LeaseTiming.legacy_bound_upper,
  LeaseTiming.legacy_bound_slack_nonzero,
  LeaseTiming.legacy_bound_slack_zero,
  LeaseTiming.legacy_bound_slack_nonneg,
  LeaseTiming.legacy_bound_in_domain,
  LeaseTiming.legacy_bound_domain_iff,
  LeaseTiming.trunc_bound,
  LeaseTiming.legacy_bound_is_latest,
  LeaseTiming.legacy_bound_pair).

Definition conservation_theorems := (
  Conservation.settle_split_granted,
  Conservation.settle_split_used,
  Conservation.settle_exclusive,
  Conservation.settlement_conserves_units,
  Conservation.settle_at_preserves_invariant,
  Conservation.credit_preserves_invariant,
  Conservation.acquire_preserves_invariant,
  Conservation.use_leased_preserves_invariant,
  Conservation.use_overage_preserves_invariant,
  Conservation.release_preserves_invariant,
  Conservation.reclaim_preserves_invariant,
  Conservation.consolidate_preserves_invariant,
  Conservation.step_preserves_invariant,
  Conservation.step_monotone,
  Conservation.step_preserves_fences,
  Conservation.consolidation_settles_sources,
  Conservation.reachable_invariant).

Print Assumptions lease_timing_theorems.
Print Assumptions conservation_theorems.
