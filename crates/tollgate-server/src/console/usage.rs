//! The account page's usage chart: the last 24 hours by hour or the last 30
//! days by day, stacked by credential or by one dimension's values, from
//! the same usage query as `GET /v1/accounts/{id}/usage`.

use jiff::{SignedDuration, Timestamp};
use maud::{Markup, html};
use tollgate_core::usage::is_valid_dimension_key;
use tollgate_core::{Credential, GroupBy, Range, UsageQuery, UsageReport, Window};

use super::layout::{account_path, query};
use super::svg::{self, Stacked};
use crate::AppState;
use crate::extract::QueryParams;

/// Which chart the page shows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Choice {
    pub(crate) days: bool,
    /// `credential` or `dimension:KEY`, as the usage route names it.
    pub(crate) by: String,
    group_by: GroupBy,
}

impl Choice {
    /// From the page's `range` (`24h`, the default, or `30d`) and `by`
    /// (`credential`, the default, or `dimension:KEY`, or a bare `dimension`
    /// field holding KEY from the form).
    pub(crate) fn of(params: QueryParams) -> Result<Choice, String> {
        let params = params
            .only(&["range", "by", "dimension"])
            .map_err(|_| "The account page takes only range, by and dimension.".to_owned())?;
        let days = match params.get("range") {
            None | Some("24h") => false,
            Some("30d") => true,
            Some(_) => return Err("range must be 24h or 30d.".into()),
        };
        let by = match (params.get("by"), params.get("dimension").map(str::trim)) {
            (Some("dimension"), Some(key)) => format!("dimension:{key}"),
            (None | Some("credential"), _) => "credential".to_owned(),
            (Some(other), _) => other.to_owned(),
        };
        let group_by = match by.strip_prefix("dimension:") {
            Some(key) if is_valid_dimension_key(key) => GroupBy::Dimension(key.to_owned()),
            Some(_) => return Err("A dimension key is 1 to 64 characters of a-z 0-9 _ . -".into()),
            None if by == "credential" => GroupBy::Credential,
            None => return Err("by must be credential or dimension:KEY.".into()),
        };
        Ok(Choice { days, by, group_by })
    }

    /// The query the chart shows at `now`: 24 hourly or 30 daily buckets
    /// ending with the one that holds `now`.
    pub(crate) fn query(&self, now: Timestamp) -> Result<UsageQuery, tollgate_core::Error> {
        let (window, buckets) = if self.days { (Window::Day, 30) } else { (Window::Hour, 24) };
        let width = window.micros();
        let end = (now.as_microsecond().div_euclid(width) + 1) * width;
        let to = Timestamp::from_microsecond(end).map_err(|_| tollgate_core::Error::InvalidRange)?;
        let from = to
            .checked_sub(SignedDuration::from_micros(width * buckets))
            .map_err(|_| tollgate_core::Error::InvalidRange)?;
        UsageQuery::new(Range::new(from, to)?, Some(window), self.group_by.clone())
    }
}

/// The chart's data: the report and each series' name.
pub(crate) struct UsageView {
    report: UsageReport,
    /// Series keys in legend order: the `None` group first, then by key.
    keys: Vec<Option<String>>,
    names: Vec<String>,
}

pub(crate) async fn read(
    state: &AppState,
    account_id: &str,
    choice: &Choice,
) -> Result<UsageReport, tollgate_core::Error> {
    let query = choice.query(state.now())?;
    state.store().usage(account_id, &query).await
}

impl UsageView {
    /// The chart of `report`, its series named from the account's
    /// `credentials` when grouped by credential.
    pub(crate) fn new(report: UsageReport, choice: &Choice, credentials: &[Credential]) -> UsageView {
        let mut keys: Vec<Option<String>> =
            report.buckets.iter().flat_map(|bucket| bucket.groups.iter().map(|group| group.key.clone())).collect();
        keys.sort();
        keys.dedup();
        let names = keys.iter().map(|key| series_name(key.as_deref(), &choice.group_by, credentials)).collect();
        UsageView { report, keys, names }
    }
}

fn series_name(key: Option<&str>, group_by: &GroupBy, credentials: &[Credential]) -> String {
    match (key, group_by) {
        (None, GroupBy::Dimension(name)) => format!("(no {name})"),
        (None, _) => "(no credential)".to_owned(),
        (Some(id), GroupBy::Credential) => match credentials.iter().find(|c| c.credential_id == id) {
            Some(credential) if !credential.label.is_empty() => format!("{} ({id})", credential.label),
            _ => id.to_owned(),
        },
        (Some(value), _) => value.to_owned(),
    }
}

impl UsageView {
    /// `columns[bucket][series]`: units per bucket and series.
    fn columns(&self) -> Vec<Vec<u128>> {
        self.report
            .buckets
            .iter()
            .map(|bucket| {
                self.keys
                    .iter()
                    .map(|key| bucket.groups.iter().find(|g| &g.key == key).map_or(0, |g| g.totals.units))
                    .collect()
            })
            .collect()
    }

    fn series_total(&self, key: &Option<String>) -> (u128, u128) {
        self.report
            .buckets
            .iter()
            .flat_map(|bucket| &bucket.groups)
            .filter(|group| &group.key == key)
            .fold((0, 0), |(units, events), group| (units + group.totals.units, events + group.totals.events))
    }
}

/// The usage section: the switches, the chart and its numbers.
pub(crate) fn section(account_id: &str, choice: &Choice, view: &UsageView) -> Markup {
    let labels: Vec<String> = view
        .report
        .buckets
        .iter()
        .map(|bucket| {
            if choice.days {
                bucket.start.strftime("%m-%d").to_string()
            } else {
                bucket.start.strftime("%H:00").to_string()
            }
        })
        .collect();
    let columns = view.columns();
    let title = if choice.days { "Units per day, last 30 days (UTC)" } else { "Units per hour, last 24 hours (UTC)" };
    let chart = Stacked { title, column_labels: &labels, label_every: 6, series: &view.names, columns: &columns };
    let path = account_path(account_id);
    html! {
        section #usage aria-labelledby="usage-heading" {
            h2 #usage-heading { "Usage" }
            nav.switch aria-label="Usage range" {
                a href={(path) "?" (query(&[("range", "24h"), ("by", &choice.by)]))}
                    aria-current=[(!choice.days).then_some("page")] { "Last 24 hours" }
                a href={(path) "?" (query(&[("range", "30d"), ("by", &choice.by)]))}
                    aria-current=[choice.days.then_some("page")] { "Last 30 days" }
            }
            (grouping_form(choice))
            (svg::stacked(&chart))
            (totals(view))
        }
    }
}

fn grouping_form(choice: &Choice) -> Markup {
    let dimension = choice.by.strip_prefix("dimension:");
    html! {
        form.search #usage-grouping method="get" {
            input type="hidden" name="range" value=(if choice.days { "30d" } else { "24h" });
            label for="by" { "Stack by" }
            select #by name="by" {
                option value="credential" selected[dimension.is_none()] { "credential" }
                option value="dimension" selected[dimension.is_some()] { "dimension" }
            }
            label for="dimension" { "Dimension key" }
            input #dimension type="text" name="dimension" value=(dimension.unwrap_or("")) maxlength="64";
            button type="submit" { "Show" }
        }
    }
}

fn totals(view: &UsageView) -> Markup {
    html! {
        div.scroll { table #usage-totals {
            caption { "Totals of the chart's range" }
            thead { tr { th scope="col" { "Series" } th.num scope="col" { "Units" } th.num scope="col" { "Events" } } }
            tbody {
                @for (i, (key, name)) in view.keys.iter().zip(&view.names).enumerate() {
                    @let (units, events) = view.series_total(key);
                    tr data-series=(key.as_deref().unwrap_or("")) {
                        th scope="row" { span class={"swatch " (svg::series_class(i))} {} (name) }
                        td.num.units { (units) }
                        td.num.events { (events) }
                    }
                }
            }
            tfoot { tr {
                th scope="row" { "All" }
                td.num #usage-total { (view.report.total.units) }
                td.num #usage-events { (view.report.total.events) }
            } }
        } }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_chart_ends_with_the_bucket_that_holds_now() {
        let now: Timestamp = "2026-12-01T21:18:46Z".parse().unwrap();
        let hourly = Choice::of(QueryParams::parse("")).unwrap().query(now).unwrap();
        assert_eq!(hourly.range.to, "2026-12-01T22:00:00Z".parse::<Timestamp>().unwrap());
        assert_eq!(hourly.range.from, "2026-11-30T22:00:00Z".parse::<Timestamp>().unwrap());
        let daily = Choice::of(QueryParams::parse("range=30d&by=dimension&dimension=model")).unwrap();
        assert_eq!(daily.by, "dimension:model");
        let daily = daily.query(now).unwrap();
        assert_eq!(daily.range.to, "2026-12-02T00:00:00Z".parse::<Timestamp>().unwrap());
        assert_eq!(daily.range.from, "2026-11-02T00:00:00Z".parse::<Timestamp>().unwrap());
        assert_eq!(daily.group_by, GroupBy::Dimension("model".into()));
    }

    #[test]
    fn bad_choices_are_named() {
        assert!(Choice::of(QueryParams::parse("range=7d")).is_err());
        assert!(Choice::of(QueryParams::parse("by=lease")).is_err());
        assert!(Choice::of(QueryParams::parse("by=dimension&dimension=Bad Key")).is_err());
        assert!(Choice::of(QueryParams::parse("other=1")).is_err());
    }
}
