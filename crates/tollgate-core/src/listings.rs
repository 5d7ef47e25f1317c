//! The listings of the read side: accounts, and an account's leases,
//! credentials and credits, one page at a time.
//!
//! Each listing is ordered by one immutable unique key (account id, lease id,
//! credential id, credit id), so its cursor holds that one key and the next
//! page is the rows strictly after it, in key order ([`crate::page`]). A store
//! fetches [`Listing::fetch`] rows (`limit + 1`) after [`Listing::after`] and
//! hands them to [`Listing::page`]; both stores share this one definition of
//! every listing's scope and key, so a cursor is read the same way on each.

use crate::error::Error;
use crate::ids::validate_id;
use crate::ledger::LeaseState;
use crate::page::{Page, PageLimit, Scope, Start};

/// A page as a client asks for it: the cursor of the previous page, if any,
/// and the limit.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PageRequest {
    pub cursor: Option<String>,
    pub limit: PageLimit,
}

impl PageRequest {
    /// The first page, of `limit` rows.
    pub fn first(limit: PageLimit) -> Self {
        Self { cursor: None, limit }
    }

    /// The page after `cursor`, of `limit` rows.
    pub fn after(cursor: impl Into<String>, limit: PageLimit) -> Self {
        Self { cursor: Some(cursor.into()), limit }
    }
}

/// Which leases a lease listing holds: all of them, or those in one state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LeaseFilter {
    #[default]
    All,
    State(LeaseState),
}

impl LeaseFilter {
    /// The filter a request names: absent or empty is every lease, otherwise
    /// a state's name; any other value is `invalid_state`.
    pub fn parse(value: Option<&str>) -> Result<Self, Error> {
        match value {
            None | Some("") => Ok(Self::All),
            Some(name) => LeaseState::parse(name).map(Self::State).ok_or(Error::InvalidState),
        }
    }

    /// The states this filter keeps.
    pub fn states(self) -> Vec<LeaseState> {
        match self {
            Self::All => LeaseState::ALL.to_vec(),
            Self::State(state) => vec![state],
        }
    }

    pub fn matches(self, state: LeaseState) -> bool {
        self == Self::All || self == Self::State(state)
    }

    /// The filter's name in a cursor's scope: `""` for every lease.
    fn name(self) -> &'static str {
        match self {
            Self::All => "",
            Self::State(state) => state.as_str(),
        }
    }
}

/// One credit of an account, as the credit listing shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CreditEntry {
    pub credit_id: String,
    pub units: u64,
}

/// Whether an account id can start with `prefix`. A prefix that cannot (it
/// has a character no identifier has) matches no account, so a store answers
/// an empty page without asking storage, which could not hold such text.
pub fn account_prefix_can_match(prefix: &str) -> bool {
    prefix.is_empty() || validate_id("prefix", prefix).is_ok()
}

/// One page of one listing: its scope, where it starts and its limit.
#[derive(Debug, Clone)]
pub struct Listing {
    scope: Scope,
    after: Option<String>,
    limit: PageLimit,
}

/// Every listing's cursor holds one key field.
const KEY_FIELDS: usize = 1;

impl Listing {
    /// Accounts whose id starts with `prefix` (`""`: every account), by id.
    pub fn accounts(prefix: &str, page: &PageRequest) -> Result<Self, Error> {
        Self::new("accounts", &[prefix], page)
    }

    /// The leases of `account_id` that `filter` keeps, by lease id.
    pub fn leases(account_id: &str, filter: LeaseFilter, page: &PageRequest) -> Result<Self, Error> {
        Self::new("leases", &[account_id, filter.name()], page)
    }

    /// The credentials of `account_id`, by credential id.
    pub fn credentials(account_id: &str, page: &PageRequest) -> Result<Self, Error> {
        Self::new("credentials", &[account_id], page)
    }

    /// The credits of `account_id`, by credit id.
    pub fn credits(account_id: &str, page: &PageRequest) -> Result<Self, Error> {
        Self::new("credits", &[account_id], page)
    }

    /// The deliveries of webhook endpoint `endpoint_id`, by delivery id, which
    /// sorts by creation.
    pub fn deliveries(endpoint_id: &str, page: &PageRequest) -> Result<Self, Error> {
        Self::new("deliveries", &[endpoint_id], page)
    }

    fn new(listing: &str, parameters: &[&str], page: &PageRequest) -> Result<Self, Error> {
        let scope = Scope::new(listing, parameters);
        let after = match Start::of(&scope, page.cursor.as_deref(), KEY_FIELDS)? {
            Start::First => None,
            Start::After(mut key) => key.pop(),
        };
        // No key holds NUL (identifiers are `[A-Za-z0-9._:-]`), and storage
        // could not compare text that does: such a cursor was altered.
        if after.as_deref().is_some_and(|key| key.contains('\0')) {
            return Err(Error::InvalidCursor);
        }
        Ok(Self { scope, after, limit: page.limit })
    }

    /// The key the page starts strictly after; `None` on the first page.
    pub fn after(&self) -> Option<&str> {
        self.after.as_deref()
    }

    /// Whether a row with key `key` comes after the cursor.
    pub fn is_after(&self, key: &str) -> bool {
        self.after.as_deref().is_none_or(|after| key > after)
    }

    /// How many rows to fetch: one more than the page holds, which shows
    /// whether another page follows.
    pub fn fetch(&self) -> usize {
        self.limit.rows() + 1
    }

    /// The page of up to [`Listing::fetch`] rows fetched in key order after
    /// [`Listing::after`].
    pub fn page<T>(&self, rows: Vec<T>, key: impl Fn(&T) -> &str) -> Page<T> {
        Page::from_rows(rows, self.limit, &self.scope, |row| vec![key(row).to_owned()])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_listing_pages_after_its_cursor_and_refuses_other_scopes() {
        let limit = PageLimit::new(Some(2)).unwrap();
        let first = Listing::leases("acme", LeaseFilter::All, &PageRequest::first(limit)).unwrap();
        assert_eq!((first.after(), first.fetch()), (None, 3));
        let page = first.page(vec!["a", "b", "c"], |row| row);
        assert_eq!(page.items, vec!["a", "b"]);
        let cursor = page.next_cursor.unwrap();
        let next = Listing::leases("acme", LeaseFilter::All, &PageRequest::after(cursor.clone(), limit)).unwrap();
        assert_eq!(next.after(), Some("b"));
        assert!(next.is_after("c") && !next.is_after("b") && !next.is_after("a"));
        let nul = Scope::new("credits", &["acme"]).cursor_after(&["a\0"]);
        assert_eq!(Listing::credits("acme", &PageRequest::after(nul, limit)).unwrap_err(), Error::InvalidCursor);
        let active = LeaseFilter::State(LeaseState::Active);
        for other in [
            Listing::leases("acme", active, &PageRequest::after(cursor.clone(), limit)),
            Listing::leases("other", LeaseFilter::All, &PageRequest::after(cursor.clone(), limit)),
            Listing::credentials("acme", &PageRequest::after(cursor.clone(), limit)),
            Listing::credits("acme", &PageRequest::after(cursor.clone(), limit)),
            Listing::accounts("acme", &PageRequest::after(cursor.clone(), limit)),
        ] {
            assert_eq!(other.unwrap_err(), Error::InvalidCursor);
        }
    }

    #[test]
    fn lease_filters_parse_their_state_names_only() {
        assert_eq!(LeaseFilter::parse(None), Ok(LeaseFilter::All));
        assert_eq!(LeaseFilter::parse(Some("")), Ok(LeaseFilter::All));
        assert_eq!(LeaseFilter::parse(Some("released")), Ok(LeaseFilter::State(LeaseState::Released)));
        for bad in ["all", "Active", "expired", " active"] {
            assert_eq!(LeaseFilter::parse(Some(bad)), Err(Error::InvalidState), "{bad}");
        }
        assert_eq!(LeaseFilter::All.states().len(), 4);
        assert!(LeaseFilter::State(LeaseState::Active).matches(LeaseState::Active));
        assert!(!LeaseFilter::State(LeaseState::Active).matches(LeaseState::Released));
    }

    #[test]
    fn only_identifier_prefixes_can_match() {
        assert!(account_prefix_can_match(""));
        assert!(account_prefix_can_match("acme-"));
        assert!(!account_prefix_can_match("a b"));
        assert!(!account_prefix_can_match("a\0"));
    }
}
