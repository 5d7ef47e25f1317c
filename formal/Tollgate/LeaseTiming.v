(** * Tollgate.LeaseTiming

    Lease timing over exact integer nanoseconds (seed 000, SPEC sections 2 and 3).

    Instants are integers of nanoseconds since the Unix epoch, and durations are
    integers of nanoseconds.  The model uses unbounded [Z] on purpose: it states
    what the exact answer is, and the property tests of SPEC section 7 check that
    the finite [jiff] and [i128] arithmetic computes that answer.  The arithmetic
    steps are discharged by [lia], a decision procedure for linear integer
    arithmetic, so no inequality here rests on a hand calculation. *)

From Coq Require Import ZArith Lia.
Open Scope Z_scope.

(** ** Pair encoding of instants

    PostgreSQL stores an instant as [(floor_us, submicro_ns)] meaning
    [1000 * floor_us + submicro_ns] nanoseconds.  [Z.div] and [Z.modulo] round
    toward negative infinity, which is the decoding the schema needs: the
    remainder stays in [0, 999] even before the epoch. *)

Definition enc (f s : Z) : Z := 1000 * f + s.

Definition dec (n : Z) : Z * Z := (n / 1000, n mod 1000).

(** The encoding is the documented formula whenever the remainder is in range. *)
Theorem enc_formula : forall f s, 0 <= s < 1000 -> enc f s = 1000 * f + s.
Proof. intros f s _. reflexivity. Qed.

(** Decoding recovers the stored pair, so no two valid rows denote one instant. *)
Theorem dec_enc : forall f s, 0 <= s < 1000 -> dec (enc f s) = (f, s).
Proof.
  intros f s Hs. unfold dec, enc. f_equal.
  - symmetry. apply Z.div_unique with (r := s); lia.
  - symmetry. apply Z.mod_unique with (q := f); lia.
Qed.

(** Encoding the decoded pair gives back the instant, for every integer. *)
Theorem enc_dec : forall n, enc (fst (dec n)) (snd (dec n)) = n.
Proof.
  intros n. unfold enc, dec. cbn [fst snd].
  pose proof (Z.div_mod n 1000 ltac:(lia)). lia.
Qed.

(** The decoded remainder always satisfies the [submicro_ns] column check. *)
Theorem dec_submicro_range : forall n, 0 <= snd (dec n) < 1000.
Proof. intros n. unfold dec. cbn [snd]. apply Z.mod_pos_bound. lia. Qed.

(** Lexicographic (tuple) order on [(floor_us, submicro_ns)], as SQL compares rows. *)
Definition lex_lt (p q : Z * Z) : Prop :=
  fst p < fst q \/ (fst p = fst q /\ snd p < snd q).

Definition lex_le (p q : Z * Z) : Prop :=
  fst p < fst q \/ (fst p = fst q /\ snd p <= snd q).

(** Strict tuple order is strict instant order, including negative [floor_us]. *)
Theorem lex_lt_iff_enc_lt : forall f1 s1 f2 s2,
  0 <= s1 < 1000 -> 0 <= s2 < 1000 ->
  (lex_lt (f1, s1) (f2, s2) <-> enc f1 s1 < enc f2 s2).
Proof. intros f1 s1 f2 s2 H1 H2. unfold lex_lt, enc. cbn [fst snd]. lia. Qed.

(** Non-strict tuple order is non-strict instant order, including negative [floor_us]. *)
Theorem lex_le_iff_enc_le : forall f1 s1 f2 s2,
  0 <= s1 < 1000 -> 0 <= s2 < 1000 ->
  (lex_le (f1, s1) (f2, s2) <-> enc f1 s1 <= enc f2 s2).
Proof. intros f1 s1 f2 s2 H1 H2. unfold lex_le, enc. cbn [fst snd]. lia. Qed.

(** Seen from the instants: decoding is strictly monotone, so an index on the pair
    orders rows exactly as the instants they store. *)
Theorem dec_order : forall n1 n2,
  (n1 < n2 <-> lex_lt (dec n1) (dec n2)) /\ (n1 <= n2 <-> lex_le (dec n1) (dec n2)).
Proof.
  intros n1 n2.
  pose proof (enc_dec n1) as E1. pose proof (enc_dec n2) as E2.
  pose proof (dec_submicro_range n1) as R1. pose proof (dec_submicro_range n2) as R2.
  destruct (dec n1) as [f1 s1]. destruct (dec n2) as [f2 s2]. cbn [fst snd] in *.
  rewrite (lex_lt_iff_enc_lt f1 s1 f2 s2 R1 R2), (lex_le_iff_enc_le f1 s1 f2 s2 R1 R2).
  rewrite E1, E2. tauto.
Qed.

(** ** The jiff timestamp domain

    [Timestamp::MIN] is -377705023201 s and [Timestamp::MAX] is
    253402207200.999999999 s.  The microsecond bounds are the [floor_us] column
    checks. *)

(** The constants are written as literals so that [lia] never has to evaluate a
    power; the two theorems below tie them to the documented second-based form. *)
Definition MIN_NS : Z := -377705023201000000000.
Definition MAX_NS : Z := 253402207200999999999.
Definition MIN_US : Z := -377705023201000000.
Definition MAX_US : Z := 253402207200999999.

Definition in_domain (t : Z) : Prop := MIN_NS <= t <= MAX_NS.

(** [Timestamp::MIN] is -377705023201 whole seconds. *)
Theorem MIN_NS_seconds : MIN_NS = -377705023201 * 10 ^ 9.
Proof. reflexivity. Qed.

(** [Timestamp::MAX] is 253402207200 seconds and 999999999 nanoseconds. *)
Theorem MAX_NS_seconds : MAX_NS = 253402207200 * 10 ^ 9 + 999999999.
Proof. reflexivity. Qed.

Ltac domain_lia :=
  unfold in_domain, MIN_NS, MAX_NS, MIN_US, MAX_US in *;
  lia.

(** The domain endpoints are exactly the corner pairs of the column checks. *)
Theorem domain_endpoints : MIN_NS = enc MIN_US 0 /\ MAX_NS = enc MAX_US 999.
Proof. unfold enc. split; domain_lia. Qed.

(** The nanosecond domain is exactly the rectangle of the two column checks, so
    the database CHECKs accept every jiff timestamp and nothing else. *)
Theorem domain_rectangle : forall f s,
  0 <= s <= 999 ->
  (MIN_NS <= enc f s <= MAX_NS <-> (MIN_US <= f <= MAX_US /\ 0 <= s <= 999)).
Proof. intros f s Hs. unfold enc. domain_lia. Qed.

(** Every in-domain instant decodes to a pair that passes the column checks, and
    only those do. *)
Theorem dec_domain : forall n,
  in_domain n <-> (MIN_US <= fst (dec n) <= MAX_US /\ 0 <= snd (dec n) <= 999).
Proof.
  intros n. pose proof (enc_dec n) as E. pose proof (dec_submicro_range n) as R.
  unfold in_domain. rewrite <- E at 1 2.
  apply domain_rectangle. lia.
Qed.

(** ** The reclaim boundary

    A lease with expiry [e] is reclaimable at [n] exactly when [e + g <= n] for the
    grace [g].  The implementation never forms [e + g], which may overflow the
    domain; it computes [cutoff n g = n - g] with checked arithmetic and compares
    [e <= cutoff]. *)

(** [injection] tries to reduce the huge literal bounds, which is very slow, so
    the constructor is peeled off with this lemma instead. *)
Lemma some_inj : forall a b : Z, Some a = Some b -> a = b.
Proof. congruence. Qed.

Definition cutoff (n g : Z) : option Z :=
  if MIN_NS <=? n - g then Some (n - g) else None.

(** The checked cutoff answers the boundary question exactly.  Only [e] needs to
    be in the domain: the equivalence holds for any grace and any [n], so it holds
    in particular for [g >= 0] and in-domain [n]. *)
Theorem cutoff_equiv : forall e g n,
  in_domain e ->
  (e + g <= n <-> exists c, cutoff n g = Some c /\ e <= c).
Proof.
  intros e g n He. unfold cutoff.
  destruct (Z.leb_spec MIN_NS (n - g)) as [Hle | Hlt]; split.
  - intros H. exists (n - g). split; [reflexivity | lia].
  - intros [c [Hc Hec]]. apply some_inj in Hc. subst c. lia.
  - intros H. exfalso. unfold in_domain in He. lia.
  - intros [c [Hc _]]. discriminate Hc.
Qed.

(** The form stated in the brief: nonnegative grace, [e] and [n] in the domain. *)
Corollary cutoff_equiv_domain : forall e g n,
  0 <= g -> in_domain e -> in_domain n ->
  (e + g <= n <-> exists c, cutoff n g = Some c /\ e <= c).
Proof. intros e g n _ He _. apply cutoff_equiv. exact He. Qed.

(** When the subtraction underflows, no representable expiry is due, so reclaim
    may report "nothing is due" instead of failing or saturating. *)
Theorem cutoff_none_nothing_due : forall n g,
  cutoff n g = None -> forall e, in_domain e -> ~ (e + g <= n).
Proof.
  intros n g Hc e He Hdue. unfold cutoff in Hc.
  destruct (Z.leb_spec MIN_NS (n - g)) as [Hle | Hlt].
  - discriminate Hc.
  - unfold in_domain in He. lia.
Qed.

(** A successful cutoff is itself a timestamp no later than [n], so the checked
    subtraction in Rust cannot fail at the upper end either. *)
Theorem cutoff_some_in_domain : forall n g c,
  0 <= g -> in_domain n -> cutoff n g = Some c -> in_domain c /\ c <= n.
Proof.
  intros n g c Hg Hn Hc. unfold cutoff in Hc.
  destruct (Z.leb_spec MIN_NS (n - g)) as [Hle | Hlt].
  - apply some_inj in Hc. subst c. unfold in_domain in *. lia.
  - discriminate Hc.
Qed.

(** A deadline beyond [Timestamp::MAX] has not elapsed at any representable
    [n], [MAX_NS] included: the deadline is never saturated to an earlier time. *)
Theorem beyond_max_never_due : forall e g,
  MAX_NS < e + g -> forall n, n <= MAX_NS -> ~ (e + g <= n).
Proof. intros e g Hbeyond n Hn Hdue. lia. Qed.

(** The same fact seen through the cutoff that reclaim actually compares with:
    even at [MAX_NS] the cutoff, if any, lies strictly before such an expiry. *)
Theorem beyond_max_cutoff_before_expiry : forall e g c,
  MAX_NS < e + g -> cutoff MAX_NS g = Some c -> c < e.
Proof.
  intros e g c Hbeyond Hc. unfold cutoff in Hc.
  destruct (Z.leb_spec MIN_NS (MAX_NS - g)) as [Hle | Hlt].
  - apply some_inj in Hc. subst c. lia.
  - discriminate Hc.
Qed.

(** ** TTL clamping

    The effective TTL is [min ttl max_ttl]: clamped only to [max_ttl], never
    rounded, with no minimum. *)

Definition eff (ttl max_ttl : Z) : Z := Z.min ttl max_ttl.

(** A positive request under a positive policy gives a positive lease duration. *)
Theorem eff_pos : forall ttl max_ttl, 0 < ttl -> 0 < max_ttl -> 0 < eff ttl max_ttl.
Proof. intros ttl max_ttl H1 H2. unfold eff. lia. Qed.

(** The policy maximum is never exceeded. *)
Theorem eff_le_max : forall ttl max_ttl, eff ttl max_ttl <= max_ttl.
Proof. intros ttl max_ttl. unfold eff. lia. Qed.

(** A lease never lives longer than the caller asked. *)
Theorem eff_le_ttl : forall ttl max_ttl, eff ttl max_ttl <= ttl.
Proof. intros ttl max_ttl. unfold eff. lia. Qed.

(** A request within the policy is honoured to the nanosecond. *)
Theorem eff_exact : forall ttl max_ttl, ttl <= max_ttl -> eff ttl max_ttl = ttl.
Proof. intros ttl max_ttl H. unfold eff. lia. Qed.

(** A request over the policy gets exactly [max_ttl]: there is no rounding. *)
Theorem eff_clamped : forall ttl max_ttl, max_ttl <= ttl -> eff ttl max_ttl = max_ttl.
Proof. intros ttl max_ttl H. unfold eff. lia. Qed.

(** The new expiry lies strictly after [now]. *)
Theorem expiry_after_now : forall now ttl max_ttl,
  0 < ttl -> 0 < max_ttl -> now < now + eff ttl max_ttl.
Proof. intros now ttl max_ttl H1 H2. unfold eff. lia. Qed.

(** Since the effective TTL is positive, the only way an expiry leaves the domain
    is past [MAX_NS]; checking that one bound before any debit is sufficient. *)
Theorem expiry_representable : forall now ttl max_ttl,
  in_domain now -> 0 < ttl -> 0 < max_ttl ->
  (in_domain (now + eff ttl max_ttl) <-> now + eff ttl max_ttl <= MAX_NS).
Proof.
  intros now ttl max_ttl Hnow H1 H2.
  pose proof (eff_pos ttl max_ttl H1 H2).
  unfold in_domain in *. lia.
Qed.

(** ** Legacy bounds (migration 0017)

    Legacy writers stored [expires_at_us = t quot 1000], truncated toward zero.
    The migration cannot recover [t]; it records the latest instant consistent
    with the stored value: [+999 ns] for nonnegative microseconds, and the stored
    instant itself for negative ones. *)

Definition trunc (t : Z) : Z := Z.quot t 1000.

Definition bound (u : Z) : Z := if 0 <=? u then 1000 * u + 999 else 1000 * u.

(** Truncation toward zero leaves a remainder with the sign of [t]. *)
Lemma trunc_facts : forall t,
  t = 1000 * trunc t + Z.rem t 1000 /\
  (0 <= t -> 0 <= Z.rem t 1000 < 1000) /\
  (t < 0 -> -1000 < Z.rem t 1000 <= 0).
Proof.
  intros t. unfold trunc. split; [| split].
  - apply Z.quot_rem'.
  - intros Ht. apply Z.rem_bound_pos; lia.
  - intros Ht. replace t with (- (- t)) by lia.
    rewrite Z.rem_opp_l by lia.
    pose proof (Z.rem_bound_pos (- t) 1000 ltac:(lia) ltac:(lia)). lia.
Qed.

(** The bound never makes an advertised expiry earlier. *)
Theorem legacy_bound_upper : forall t, t <= bound (trunc t).
Proof.
  intros t. pose proof (trunc_facts t). unfold bound.
  destruct (Z.leb_spec 0 (trunc t)); lia.
Qed.

(** Outside the zero-microsecond bucket, settlement is delayed by at most 999 ns. *)
Theorem legacy_bound_slack_nonzero : forall t,
  trunc t <> 0 -> bound (trunc t) - t <= 999.
Proof.
  intros t Hu. pose proof (trunc_facts t). unfold bound.
  destruct (Z.leb_spec 0 (trunc t)); lia.
Qed.

(** The zero-microsecond bucket spans -999 through +999 ns, so its delay is at
    most 1998 ns. *)
Theorem legacy_bound_slack_zero : forall t,
  trunc t = 0 -> bound (trunc t) - t <= 1998.
Proof.
  intros t Hu. pose proof (trunc_facts t). unfold bound.
  destruct (Z.leb_spec 0 (trunc t)); lia.
Qed.

(** The slack is never negative, so the two slack bounds are the whole story. *)
Theorem legacy_bound_slack_nonneg : forall t, 0 <= bound (trunc t) - t.
Proof. intros t. pose proof (legacy_bound_upper t). lia. Qed.

(** A legacy row written from an in-domain instant backfills to an in-domain
    instant, so the migration's validation never rejects honest history. *)
Theorem legacy_bound_in_domain : forall t, in_domain t -> in_domain (bound (trunc t)).
Proof.
  intros t Ht. pose proof (trunc_facts t). unfold bound.
  destruct (Z.leb_spec 0 (trunc t)); domain_lia.
Qed.

(** The migration may validate the stored microseconds alone: the backfilled
    instant is in the domain exactly when the legacy value passes the [floor_us]
    check. *)
Theorem legacy_bound_domain_iff : forall u,
  in_domain (bound u) <-> MIN_US <= u <= MAX_US.
Proof.
  intros u. unfold bound.
  destruct (Z.leb_spec 0 u); domain_lia.
Qed.

(** The bound is consistent with the stored value: it truncates back to [u]. *)
Theorem trunc_bound : forall u, trunc (bound u) = u.
Proof.
  intros u. pose proof (trunc_facts (bound u)). unfold bound in *.
  destruct (Z.leb_spec 0 u); lia.
Qed.

(** The bound is the latest instant consistent with [u]: every instant that
    truncates to [u] is at or before it, and it truncates to [u] itself, so it is
    the maximum and no smaller choice would be safe. *)
Theorem legacy_bound_is_latest : forall u,
  trunc (bound u) = u /\ (forall t', trunc t' = u -> t' <= bound u).
Proof.
  intros u. split.
  - apply trunc_bound.
  - intros t' Ht'. subst u. apply legacy_bound_upper.
Qed.

(** The backfill writes the legacy microseconds unchanged as [floor_us], with
    [submicro_ns] 999 for nonnegative and 0 for negative values. *)
Theorem legacy_bound_pair : forall u,
  dec (bound u) = (u, if 0 <=? u then 999 else 0).
Proof.
  intros u. unfold bound. destruct (0 <=? u).
  - apply dec_enc. lia.
  - replace (1000 * u) with (enc u 0) by (unfold enc; lia). apply dec_enc. lia.
Qed.
