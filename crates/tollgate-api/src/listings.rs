//! The listings' wire shape: `{"items": [...], "next_cursor": "…" | null}`.
//!
//! Items reuse the single-resource bodies (`AccountBody`, `LeaseBody` without
//! its capability, `CredentialBody`); a credit has its own small body. The
//! cursor is opaque: a client passes it back as `cursor` to get the next
//! page, with the same account and filters, and stops when it is `null`.

use serde::{Deserialize, Serialize};
use tollgate_core::{CreditEntry, Page};
use utoipa::ToSchema;

/// One page of a listing, in the listing's key order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct PageBody<T> {
    pub items: Vec<T>,
    /// Passed back as `cursor`, it resumes after the last item; `null` when
    /// this page is the last.
    pub next_cursor: Option<String>,
}

impl<T> PageBody<T> {
    /// The wire page of a store page, each item converted to its body.
    pub fn of<U>(page: &Page<U>) -> Self
    where
        T: for<'a> From<&'a U>,
    {
        Self { items: page.items.iter().map(T::from).collect(), next_cursor: page.next_cursor.clone() }
    }
}

/// A credit of an account: its id and the units it added.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct CreditBody {
    pub credit_id: String,
    pub units: u64,
}

impl From<&CreditEntry> for CreditBody {
    fn from(credit: &CreditEntry) -> Self {
        Self { credit_id: credit.credit_id.clone(), units: credit.units }
    }
}
