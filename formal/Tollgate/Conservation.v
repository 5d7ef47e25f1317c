(** * Tollgate.Conservation

    The per-account ledger over natural numbers (SPEC section 2, "Ledger").

    The model is one account with its counters and the list of its leases.  A lease
    is addressed by its position in that list, which stands for its [lease_id].
    Every accepted operation is a transition of [step], guarded by the same
    preconditions the allocator checks.  The theorems show that every transition
    keeps the three ledger equations, and that the monotonic counters never go
    back.  Timing, capabilities, fences of usage events and idempotency keys are
    checks that decide whether a transition is accepted; they do not change the
    arithmetic, so they are not modelled here. *)

From Coq Require Import List Arith Lia.
Import ListNotations.

(** ** Model *)

Inductive lease_state : Set := Active | Released | Reclaimed | Consolidated.

Record lease : Set := mk_lease {
  granted : nat;
  used : nat;
  fence : nat;
  state : lease_state
}.

Record account : Set := mk_account {
  credited : nat;
  available : nat;
  reserved : nat;
  consumed : nat;
  overage : nat;
  billed : nat;
  next_fence : nat;
  leases : list lease
}.

Definition is_active (l : lease) : bool :=
  match state l with Active => true | _ => false end.

(** A lease contributes to [reserved] and to the billed usage only while active. *)
Definition active_granted (l : lease) : nat := if is_active l then granted l else 0.
Definition active_used (l : lease) : nat := if is_active l then used l else 0.

Fixpoint sum_by (f : lease -> nat) (ls : list lease) : nat :=
  match ls with
  | [] => 0
  | l :: rest => f l + sum_by f rest
  end.

(** The three ledger equations of SPEC section 2. *)
Definition Invariant (a : account) : Prop :=
  credited a = available a + reserved a + consumed a /\
  reserved a = sum_by active_granted (leases a) /\
  billed a = consumed a + overage a + sum_by active_used (leases a).

(** ** Settlement arithmetic *)

Definition charged (g u : nat) : nat := Nat.min u g.
Definition returned (g u : nat) : nat := g - charged g u.
Definition excess (g u : nat) : nat := u - charged g u.

(** The grant splits exactly into what is charged and what goes back to the pool. *)
Theorem settle_split_granted : forall g u, charged g u + returned g u = g.
Proof. intros g u. unfold returned, charged. lia. Qed.

(** The usage splits exactly into what is charged and what is billed as overage,
    so usage beyond a grant is never dropped. *)
Theorem settle_split_used : forall g u, charged g u + excess g u = u.
Proof. intros g u. unfold excess, charged. lia. Qed.

(** A settlement either returns units or records overage, never both. *)
Theorem settle_exclusive : forall g u, returned g u = 0 \/ excess g u = 0.
Proof. intros g u. unfold returned, excess, charged. lia. Qed.

(** ** List helpers *)

Fixpoint set_nth {A : Type} (i : nat) (x : A) (xs : list A) {struct xs} : list A :=
  match xs with
  | [] => []
  | y :: rest => match i with O => x :: rest | S k => y :: set_nth k x rest end
  end.

(** Replacing one lease changes a sum by exactly the difference of the two terms;
    stated additively because [nat] subtraction truncates. *)
Lemma sum_by_set_nth : forall f ls i l l',
  nth_error ls i = Some l ->
  sum_by f (set_nth i l' ls) + f l = sum_by f ls + f l'.
Proof.
  intros f ls. induction ls as [| h rest IH]; intros i l l' H.
  - destruct i; discriminate H.
  - destruct i as [| k]; simpl in *.
    + injection H as H. subst h. lia.
    + specialize (IH k l l' H). lia.
Qed.

Lemma sum_by_app : forall f xs ys, sum_by f (xs ++ ys) = sum_by f xs + sum_by f ys.
Proof.
  intros f xs ys. induction xs as [| h rest IH]; simpl; lia.
Qed.

Lemma nth_error_set_nth_same : forall {A : Type} (xs : list A) i x y,
  nth_error xs i = Some y -> nth_error (set_nth i x xs) i = Some x.
Proof.
  intros A xs. induction xs as [| h rest IH]; intros i x y H.
  - destruct i; discriminate H.
  - destruct i as [| k]; simpl in *; [reflexivity | eapply IH; exact H].
Qed.

Lemma nth_error_set_nth_other : forall {A : Type} (xs : list A) i j x,
  i <> j -> nth_error (set_nth i x xs) j = nth_error xs j.
Proof.
  intros A xs. induction xs as [| h rest IH]; intros i j x Hij.
  - reflexivity.
  - destruct i as [| k], j as [| m]; simpl; try reflexivity.
    + contradiction Hij. reflexivity.
    + apply IH. lia.
Qed.

Lemma Forall_set_nth : forall {A : Type} (P : A -> Prop) xs i x,
  Forall P xs -> P x -> Forall P (set_nth i x xs).
Proof.
  intros A P xs. induction xs as [| h rest IH]; intros i x Hall Hx.
  - constructor.
  - inversion Hall as [| h' rest' Hh Hrest]; subst.
    destruct i as [| k]; simpl; constructor; auto.
Qed.

(** ** Transitions *)

Definition mark (l : lease) (st : lease_state) : lease :=
  mk_lease (granted l) (used l) (fence l) st.

Definition add_used (l : lease) (u : nat) : lease :=
  mk_lease (granted l) (used l + u) (fence l) (state l).

Definition new_lease (n f : nat) : lease := mk_lease n 0 f Active.

(** A new account starts empty; fences start at 1 because stored fences are
    positive (migration 0015). *)
Definition create_account : account := mk_account 0 0 0 0 0 0 1 [].

Definition credit (a : account) (n : nat) : account :=
  mk_account (credited a + n) (available a + n) (reserved a) (consumed a)
             (overage a) (billed a) (next_fence a) (leases a).

Definition acquire (a : account) (n : nat) : account :=
  mk_account (credited a) (available a - n) (reserved a + n) (consumed a)
             (overage a) (billed a) (S (next_fence a))
             (leases a ++ [new_lease n (next_fence a)]).

(** Accepted usage against lease [i].  The function is total so that it can be
    written without dependent types; [step] only uses it on an active lease. *)
Definition use_leased (a : account) (i u : nat) : account :=
  match nth_error (leases a) i with
  | Some l =>
      if is_active l then
        mk_account (credited a) (available a) (reserved a) (consumed a)
                   (overage a) (billed a + u) (next_fence a)
                   (set_nth i (add_used l u) (leases a))
      else a
  | None => a
  end.

(** Accepted overage usage carries no lease and is never drawn from [available]. *)
Definition use_overage (a : account) (u : nat) : account :=
  mk_account (credited a) (available a) (reserved a) (consumed a)
             (overage a + u) (billed a + u) (next_fence a) (leases a).

(** Settles lease [i] into final state [st] and also returns the units it handed
    back, which consolidation needs.  A lease that is not active is left alone. *)
Definition settle_at (a : account) (i : nat) (st : lease_state) : account * nat :=
  match nth_error (leases a) i with
  | Some l =>
      if is_active l then
        let g := granted l in
        let u := used l in
        (mk_account (credited a) (available a + returned g u) (reserved a - g)
                    (consumed a + charged g u) (overage a + excess g u) (billed a)
                    (next_fence a) (set_nth i (mark l st) (leases a)),
         returned g u)
      else (a, 0)
  | None => (a, 0)
  end.

Definition release (a : account) (i : nat) : account := fst (settle_at a i Released).
Definition reclaim (a : account) (i : nat) : account := fst (settle_at a i Reclaimed).

(** Settles every source in order and sums what they returned. *)
Fixpoint settle_many (a : account) (srcs : list nat) : account * nat :=
  match srcs with
  | [] => (a, 0)
  | i :: rest =>
      let (a1, r1) := settle_at a i Consolidated in
      let (a2, r2) := settle_many a1 rest in
      (a2, r1 + r2)
  end.

(** Consolidation settles the sources, then issues one lease for everything they
    returned plus [x] extra units taken from [available]. *)
Definition consolidate (a : account) (srcs : list nat) (x : nat) : account :=
  let (a1, r) := settle_many a srcs in
  let n := r + x in
  mk_account (credited a1) (available a1 - n) (reserved a1 + n) (consumed a1)
             (overage a1) (billed a1) (S (next_fence a1))
             (leases a1 ++ [new_lease n (next_fence a1)]).

Definition active_at (a : account) (i : nat) : Prop :=
  exists l, nth_error (leases a) i = Some l /\ state l = Active.

(** Every accepted operation, with the precondition the allocator checks. *)
Inductive step : account -> account -> Prop :=
  | StepCredit : forall a n,
      step a (credit a n)
  | StepAcquire : forall a n,
      0 < n -> n <= available a -> step a (acquire a n)
  | StepUseLeased : forall a i u,
      active_at a i -> step a (use_leased a i u)
  | StepUseOverage : forall a u,
      step a (use_overage a u)
  | StepRelease : forall a i,
      active_at a i -> step a (release a i)
  | StepReclaim : forall a i,
      active_at a i -> step a (reclaim a i)
  | StepConsolidate : forall a srcs x,
      NoDup srcs -> (forall i, In i srcs -> active_at a i) -> x <= available a ->
      step a (consolidate a srcs x).

(** ** Settlement conserves units *)

Lemma active_at_is_active : forall a i,
  active_at a i -> exists l, nth_error (leases a) i = Some l /\ is_active l = true.
Proof.
  intros a i [l [Hl Hs]]. exists l. split; [exact Hl |].
  unfold is_active. rewrite Hs. reflexivity.
Qed.

Lemma mark_inactive : forall l st,
  st <> Active -> active_granted (mark l st) = 0 /\ active_used (mark l st) = 0.
Proof.
  intros l st Hst. unfold active_granted, active_used, is_active, mark. simpl.
  destruct st; [contradiction Hst; reflexivity | split; reflexivity ..].
Qed.

Lemma active_terms_both : forall l,
  is_active l = true -> active_granted l = granted l /\ active_used l = used l.
Proof. intros l Ha. unfold active_granted, active_used. rewrite Ha. split; reflexivity. Qed.

(** A freshly issued lease is active with nothing used yet. *)
Lemma new_lease_terms : forall n f,
  active_granted (new_lease n f) = n /\ active_used (new_lease n f) = 0.
Proof. intros n f. split; reflexivity. Qed.

(** Usage against an active lease keeps it active and adds to its [used]. *)
Lemma add_used_terms : forall l u,
  is_active l = true ->
  active_granted (add_used l u) = granted l /\ active_used (add_used l u) = used l + u.
Proof.
  intros l u Ha. unfold active_granted, active_used, add_used, is_active in *. simpl.
  destruct (state l); [split; reflexivity | discriminate Ha ..].
Qed.

(** Moving an active lease to a final state takes its grant out of [reserved]
    and its usage out of the billed-usage sum, and nothing else. *)
Lemma settle_sums : forall a i l st,
  nth_error (leases a) i = Some l -> is_active l = true -> st <> Active ->
  sum_by active_granted (set_nth i (mark l st) (leases a)) + granted l
    = sum_by active_granted (leases a) /\
  sum_by active_used (set_nth i (mark l st) (leases a)) + used l
    = sum_by active_used (leases a).
Proof.
  intros a i l st Hl Ha Hst.
  destruct (mark_inactive l st Hst) as [Hg Hu].
  pose proof (sum_by_set_nth active_granted (leases a) i l (mark l st) Hl) as Sg.
  pose proof (sum_by_set_nth active_used (leases a) i l (mark l st) Hl) as Su.
  destruct (active_terms_both l Ha) as [Ag Au]. rewrite Ag in Sg. rewrite Au in Su.
  rewrite Hg in Sg. rewrite Hu in Su. lia.
Qed.

(** A settlement moves units between counters only: the pool total
    [available + reserved + consumed] is unchanged, and so are [credited] and
    [billed]. *)
Theorem settlement_conserves_units : forall a i st,
  Invariant a -> st <> Active ->
  let a' := fst (settle_at a i st) in
  available a' + reserved a' + consumed a' = available a + reserved a + consumed a /\
  credited a' = credited a /\ billed a' = billed a.
Proof.
  intros a i st [E1 [E2 E3]] Hst. unfold settle_at. cbv zeta.
  destruct (nth_error (leases a) i) as [l |] eqn:Hl; [| simpl; lia].
  destruct (is_active l) eqn:Ha; [| simpl; lia].
  destruct (settle_sums a i l st Hl Ha Hst) as [Sg Su]. simpl.
  pose proof (settle_split_granted (granted l) (used l)). lia.
Qed.

(** What [settle_at] hands back is exactly what it added to [available]. *)
Lemma settle_at_available : forall a i st,
  available (fst (settle_at a i st)) = available a + snd (settle_at a i st).
Proof.
  intros a i st. unfold settle_at.
  destruct (nth_error (leases a) i); [destruct (is_active l) |]; simpl; lia.
Qed.

Theorem settle_at_preserves_invariant : forall a i st,
  Invariant a -> st <> Active -> Invariant (fst (settle_at a i st)).
Proof.
  intros a i st Inv Hst. destruct Inv as [E1 [E2 E3]]. unfold settle_at.
  destruct (nth_error (leases a) i) as [l |] eqn:Hl; [| repeat split; assumption].
  destruct (is_active l) eqn:Ha; [| repeat split; assumption].
  destruct (settle_sums a i l st Hl Ha Hst) as [Sg Su].
  pose proof (settle_split_granted (granted l) (used l)).
  pose proof (settle_split_used (granted l) (used l)).
  unfold Invariant. simpl. lia.
Qed.

Lemma settle_many_available : forall srcs a,
  available (fst (settle_many a srcs)) = available a + snd (settle_many a srcs).
Proof.
  induction srcs as [| i rest IH]; intros a; simpl; [lia |].
  pose proof (settle_at_available a i Consolidated) as Hat.
  destruct (settle_at a i Consolidated) as [a1 r1]. simpl in Hat.
  specialize (IH a1). destruct (settle_many a1 rest) as [a2 r2]. simpl in *. lia.
Qed.

Lemma settle_many_preserves_invariant : forall srcs a,
  Invariant a -> Invariant (fst (settle_many a srcs)).
Proof.
  induction srcs as [| i rest IH]; intros a Inv; simpl; [exact Inv |].
  pose proof (settle_at_preserves_invariant a i Consolidated Inv ltac:(discriminate)) as H1.
  destruct (settle_at a i Consolidated) as [a1 r1]. simpl in H1.
  specialize (IH a1 H1). destruct (settle_many a1 rest) as [a2 r2]. exact IH.
Qed.

(** ** Each transition preserves the ledger equations *)

Theorem credit_preserves_invariant : forall a n,
  Invariant a -> Invariant (credit a n).
Proof. intros a n [E1 [E2 E3]]. unfold Invariant, credit. simpl. lia. Qed.

Theorem acquire_preserves_invariant : forall a n,
  n <= available a -> Invariant a -> Invariant (acquire a n).
Proof.
  intros a n Hn [E1 [E2 E3]]. unfold Invariant, acquire. simpl.
  rewrite !sum_by_app. cbn [sum_by].
  destruct (new_lease_terms n (next_fence a)) as [Ng Nu]. rewrite Ng, Nu. lia.
Qed.

Theorem use_leased_preserves_invariant : forall a i u,
  active_at a i -> Invariant a -> Invariant (use_leased a i u).
Proof.
  intros a i u Hact [E1 [E2 E3]].
  destruct (active_at_is_active a i Hact) as [l [Hl Ha]].
  unfold use_leased. rewrite Hl, Ha. unfold Invariant. simpl.
  pose proof (sum_by_set_nth active_granted (leases a) i l (add_used l u) Hl) as Sg.
  pose proof (sum_by_set_nth active_used (leases a) i l (add_used l u) Hl) as Su.
  destruct (active_terms_both l Ha) as [Ag Au].
  destruct (add_used_terms l u Ha) as [Bg Bu].
  rewrite Ag, Bg in Sg. rewrite Au, Bu in Su. lia.
Qed.

Theorem use_overage_preserves_invariant : forall a u,
  Invariant a -> Invariant (use_overage a u).
Proof. intros a u [E1 [E2 E3]]. unfold Invariant, use_overage. simpl. lia. Qed.

Theorem release_preserves_invariant : forall a i,
  Invariant a -> Invariant (release a i).
Proof. intros a i Inv. apply settle_at_preserves_invariant; [exact Inv | discriminate]. Qed.

Theorem reclaim_preserves_invariant : forall a i,
  Invariant a -> Invariant (reclaim a i).
Proof. intros a i Inv. apply settle_at_preserves_invariant; [exact Inv | discriminate]. Qed.

Theorem consolidate_preserves_invariant : forall a srcs x,
  x <= available a -> Invariant a -> Invariant (consolidate a srcs x).
Proof.
  intros a srcs x Hx Inv. unfold consolidate.
  pose proof (settle_many_available srcs a) as Hav.
  pose proof (settle_many_preserves_invariant srcs a Inv) as Inv1.
  destruct (settle_many a srcs) as [a1 r]. simpl in Hav, Inv1.
  destruct Inv1 as [E1 [E2 E3]]. unfold Invariant. simpl.
  rewrite !sum_by_app. cbn [sum_by].
  destruct (new_lease_terms (r + x) (next_fence a1)) as [Ng Nu]. rewrite Ng, Nu. lia.
Qed.

(** The combined statement: every accepted transition keeps all three equations. *)
Theorem step_preserves_invariant : forall a a',
  step a a' -> Invariant a -> Invariant a'.
Proof.
  intros a a' Hstep Inv. destruct Hstep.
  - apply credit_preserves_invariant; assumption.
  - apply acquire_preserves_invariant; assumption.
  - apply use_leased_preserves_invariant; assumption.
  - apply use_overage_preserves_invariant; assumption.
  - apply release_preserves_invariant; assumption.
  - apply reclaim_preserves_invariant; assumption.
  - apply consolidate_preserves_invariant; assumption.
Qed.

(** ** Monotonic counters *)

Definition Monotone (a a' : account) : Prop :=
  credited a <= credited a' /\ overage a <= overage a' /\
  billed a <= billed a' /\ next_fence a <= next_fence a'.

Lemma settle_at_monotone : forall a i st, Monotone a (fst (settle_at a i st)).
Proof.
  intros a i st. unfold Monotone, settle_at.
  destruct (nth_error (leases a) i); [destruct (is_active l) |]; simpl; lia.
Qed.

Lemma settle_many_monotone : forall srcs a, Monotone a (fst (settle_many a srcs)).
Proof.
  induction srcs as [| i rest IH]; intros a; simpl; [unfold Monotone; lia |].
  pose proof (settle_at_monotone a i Consolidated) as H1.
  destruct (settle_at a i Consolidated) as [a1 r1]. simpl in H1.
  specialize (IH a1). destruct (settle_many a1 rest) as [a2 r2].
  unfold Monotone in *. simpl in *. lia.
Qed.

(** [credited], [overage], [billed] and [next_fence] never decrease under any
    accepted transition. *)
Theorem step_monotone : forall a a', step a a' -> Monotone a a'.
Proof.
  intros a a' Hstep. destruct Hstep.
  - unfold Monotone, credit. simpl. lia.
  - unfold Monotone, acquire. simpl. lia.
  - unfold Monotone, use_leased.
    destruct (nth_error (leases a) i); [destruct (is_active l) |]; simpl; lia.
  - unfold Monotone, use_overage. simpl. lia.
  - apply settle_at_monotone.
  - apply settle_at_monotone.
  - unfold consolidate. pose proof (settle_many_monotone srcs a) as Hm.
    destruct (settle_many a srcs) as [a1 r]. unfold Monotone in *. simpl in *. lia.
Qed.

(** ** Fences *)

(** Every stored fence is positive and below [next_fence], so the fence handed to
    a new lease is larger than every fence the account has issued before. *)
Definition FenceInvariant (a : account) : Prop :=
  0 < next_fence a /\ Forall (fun l => 0 < fence l < next_fence a) (leases a).

Lemma settle_at_fences : forall a i st,
  FenceInvariant a -> FenceInvariant (fst (settle_at a i st)).
Proof.
  intros a i st [Hpos Hall]. unfold settle_at.
  destruct (nth_error (leases a) i) as [l |] eqn:Hl; [| split; assumption].
  destruct (is_active l); [| split; assumption].
  unfold FenceInvariant. simpl. split; [exact Hpos |].
  apply Forall_set_nth; [exact Hall |].
  unfold mark. simpl. apply nth_error_In in Hl.
  rewrite Forall_forall in Hall. apply Hall. exact Hl.
Qed.

Lemma settle_many_fences : forall srcs a,
  FenceInvariant a -> FenceInvariant (fst (settle_many a srcs)).
Proof.
  induction srcs as [| i rest IH]; intros a Hf; simpl; [exact Hf |].
  pose proof (settle_at_fences a i Consolidated Hf) as H1.
  destruct (settle_at a i Consolidated) as [a1 r1]. simpl in H1.
  specialize (IH a1 H1). destruct (settle_many a1 rest) as [a2 r2]. exact IH.
Qed.

(** Appending a lease with the current [next_fence] and incrementing the counter
    keeps every fence positive and below the counter. *)
Lemma issue_fences : forall nf ls n,
  0 < nf -> Forall (fun l => 0 < fence l < nf) ls ->
  Forall (fun l => 0 < fence l < S nf) (ls ++ [new_lease n nf]).
Proof.
  intros nf ls n Hpos Hall. apply Forall_app. split.
  - eapply Forall_impl; [| exact Hall]. intros l Hl. simpl in Hl. lia.
  - constructor; [simpl; lia | constructor].
Qed.

Theorem step_preserves_fences : forall a a',
  step a a' -> FenceInvariant a -> FenceInvariant a'.
Proof.
  intros a a' Hstep Hf. destruct Hstep.
  - exact Hf.
  - destruct Hf as [Hpos Hall]. split; simpl; [lia | apply issue_fences; assumption].
  - destruct Hf as [Hpos Hall]. unfold use_leased.
    destruct (nth_error (leases a) i) as [l |] eqn:Hl; [| split; assumption].
    destruct (is_active l); [| split; assumption].
    split; simpl; [exact Hpos |]. apply Forall_set_nth; [exact Hall |].
    unfold add_used. simpl. apply nth_error_In in Hl.
    rewrite Forall_forall in Hall. apply Hall. exact Hl.
  - exact Hf.
  - apply settle_at_fences. exact Hf.
  - apply settle_at_fences. exact Hf.
  - unfold consolidate. pose proof (settle_many_fences srcs a Hf) as Hsm.
    destruct (settle_many a srcs) as [a1 r]. simpl in Hsm. destruct Hsm as [Hpos Hall].
    split; simpl; [lia | apply issue_fences; assumption].
Qed.

(** ** Consolidation settles each source exactly once *)

Lemma settle_at_other : forall a i j st,
  i <> j -> nth_error (leases (fst (settle_at a i st))) j = nth_error (leases a) j.
Proof.
  intros a i j st Hij. unfold settle_at.
  destruct (nth_error (leases a) i); [destruct (is_active l) |]; simpl;
    [apply nth_error_set_nth_other; exact Hij | reflexivity ..].
Qed.

Lemma settle_many_other : forall srcs a j,
  ~ In j srcs ->
  nth_error (leases (fst (settle_many a srcs))) j = nth_error (leases a) j.
Proof.
  induction srcs as [| i rest IH]; intros a j Hnot; simpl; [reflexivity |].
  pose proof (settle_at_other a i j Consolidated) as Hother.
  destruct (settle_at a i Consolidated) as [a1 r1]. simpl in Hother.
  specialize (IH a1 j). destruct (settle_many a1 rest) as [a2 r2]. simpl in *.
  rewrite IH by tauto. apply Hother. intros Heq. apply Hnot. left. exact Heq.
Qed.

(** The units each source would return if settled in the account [a]. *)
Definition returned_at (a : account) (i : nat) : nat :=
  match nth_error (leases a) i with
  | Some l => returned (granted l) (used l)
  | None => 0
  end.

(** With distinct active sources, every source ends [Consolidated] with its grant
    and usage unchanged, and the new lease is funded by exactly the sum of what the
    sources returned in the original account. *)
Theorem consolidation_settles_sources : forall srcs a,
  NoDup srcs -> (forall i, In i srcs -> active_at a i) ->
  snd (settle_many a srcs) = fold_right (fun i acc => returned_at a i + acc) 0 srcs /\
  (forall i l, In i srcs -> nth_error (leases a) i = Some l ->
     nth_error (leases (fst (settle_many a srcs))) i = Some (mark l Consolidated)).
Proof.
  induction srcs as [| i rest IH]; intros a Hnd Hact.
  - split; [reflexivity | intros i l Hin; destruct Hin].
  - inversion Hnd as [| i' rest' Hnotin Hnd']; subst.
    destruct (active_at_is_active a i (Hact i (or_introl eq_refl))) as [l [Hl Ha]].
    simpl.
    assert (Hself : nth_error (leases (fst (settle_at a i Consolidated))) i
                    = Some (mark l Consolidated)).
    { unfold settle_at. rewrite Hl, Ha. simpl. eapply nth_error_set_nth_same. exact Hl. }
    assert (Hr1 : snd (settle_at a i Consolidated) = returned_at a i).
    { unfold settle_at, returned_at. rewrite Hl, Ha. reflexivity. }
    (* The other sources are untouched by settling [i], because they are distinct. *)
    assert (Hother : forall j, In j rest ->
              nth_error (leases (fst (settle_at a i Consolidated))) j = nth_error (leases a) j).
    { intros j Hj. apply settle_at_other. intros Heq. subst j. contradiction. }
    assert (Hrest : forall j, In j rest -> active_at (fst (settle_at a i Consolidated)) j).
    { intros j Hj. unfold active_at. rewrite (Hother j Hj). apply Hact. right. exact Hj. }
    assert (Hsame : forall j, In j rest ->
                    returned_at (fst (settle_at a i Consolidated)) j = returned_at a j).
    { intros j Hj. unfold returned_at. rewrite (Hother j Hj). reflexivity. }
    pose proof (settle_many_other rest (fst (settle_at a i Consolidated)) i Hnotin) as Hkeep.
    destruct (IH (fst (settle_at a i Consolidated)) Hnd' Hrest) as [Hsum Hmark].
    destruct (settle_at a i Consolidated) as [a1 r1]. simpl in *.
    destruct (settle_many a1 rest) as [a2 r2]. simpl in *.
    split.
    + rewrite Hr1, Hsum. f_equal.
      clear - Hsame. induction rest as [| j more IHm]; simpl; [reflexivity |].
      rewrite Hsame by (left; reflexivity). f_equal.
      apply IHm. intros k Hk. apply Hsame. right. exact Hk.
    + intros j l' [Heq | Hin] Hl'.
      * subst j. rewrite Hl in Hl'. injection Hl' as Hl'. subst l'.
        rewrite Hkeep. exact Hself.
      * apply Hmark; [exact Hin |].
        rewrite <- Hl'. apply Hother. exact Hin.
Qed.

(** ** Reachable accounts *)

Inductive reachable : account -> Prop :=
  | ReachInit : reachable create_account
  | ReachStep : forall a a', reachable a -> step a a' -> reachable a'.

(** Every account the allocator can produce satisfies the three equations and the
    fence discipline. *)
Theorem reachable_invariant : forall a,
  reachable a -> Invariant a /\ FenceInvariant a.
Proof.
  intros a Hr. induction Hr as [| a a' Hr [Inv Hf] Hstep].
  - split.
    + unfold Invariant, create_account. simpl. lia.
    + split; simpl; [lia | constructor].
  - split.
    + apply (step_preserves_invariant a a' Hstep Inv).
    + apply (step_preserves_fences a a' Hstep Hf).
Qed.
