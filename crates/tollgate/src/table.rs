//! What a remote subcommand prints: one table, written as an aligned text
//! table for people (the default), as CSV (`--csv`) or as one JSON document
//! (`--json`: an array with one object per row, numbers as numbers).

use std::fmt::Write as _;

/// One value of a row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Cell {
    Text(String),
    Number(u64),
    /// A signed change (a journal delta), printed with its sign.
    Signed(i128),
}

impl Cell {
    fn text(&self) -> String {
        match self {
            Cell::Text(text) => text.clone(),
            Cell::Number(number) => number.to_string(),
            Cell::Signed(change) if *change > 0 => format!("+{change}"),
            Cell::Signed(change) => change.to_string(),
        }
    }

    fn json(&self) -> serde_json::Value {
        match self {
            Cell::Text(text) => serde_json::Value::from(text.as_str()),
            Cell::Number(number) => serde_json::Value::from(*number),
            // A JSON number where one is exact everywhere serde_json can
            // hold it; beyond the 64-bit range (the memory store's u64
            // counters can change by more), its decimal string.
            Cell::Signed(change) => match i64::try_from(*change) {
                Ok(change) => serde_json::Value::from(change),
                Err(_) => serde_json::Value::from(change.to_string()),
            },
        }
    }
}

impl From<&str> for Cell {
    fn from(text: &str) -> Self {
        Cell::Text(text.to_owned())
    }
}

impl From<String> for Cell {
    fn from(text: String) -> Self {
        Cell::Text(text)
    }
}

impl From<u64> for Cell {
    fn from(number: u64) -> Self {
        Cell::Number(number)
    }
}

/// How a table is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Format {
    Text,
    Csv,
    Json,
}

/// Named columns and rows of cells, one per column.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Table {
    columns: Vec<&'static str>,
    rows: Vec<Vec<Cell>>,
}

impl Table {
    pub(crate) fn new(columns: &[&'static str]) -> Self {
        Self { columns: columns.to_vec(), rows: Vec::new() }
    }

    /// Adds a row; it has one cell per column.
    pub(crate) fn push(&mut self, row: Vec<Cell>) {
        debug_assert_eq!(row.len(), self.columns.len());
        self.rows.push(row);
    }

    pub(crate) fn render(&self, format: Format) -> String {
        match format {
            Format::Text => self.text(),
            Format::Csv => self.csv(),
            Format::Json => self.json(),
        }
    }

    /// Columns separated by two spaces, each as wide as its widest value;
    /// numbers aligned right, text left.
    fn text(&self) -> String {
        let cells: Vec<Vec<String>> = self.rows.iter().map(|row| row.iter().map(Cell::text).collect()).collect();
        let widths: Vec<usize> = (0..self.columns.len())
            .map(|i| cells.iter().map(|row| row[i].chars().count()).chain([self.columns[i].len()]).max().unwrap_or(0))
            .collect();
        let mut out = String::new();
        let header: Vec<String> = self.columns.iter().map(|name| name.to_uppercase()).collect();
        let numeric =
            |i: usize| self.rows.first().is_some_and(|row| matches!(row[i], Cell::Number(_) | Cell::Signed(_)));
        for row in std::iter::once(&header).chain(&cells) {
            let line: Vec<String> = row
                .iter()
                .enumerate()
                .map(|(i, value)| {
                    if numeric(i) {
                        format!("{value:>width$}", width = widths[i])
                    } else {
                        format!("{value:<width$}", width = widths[i])
                    }
                })
                .collect();
            let _ = writeln!(out, "{}", line.join("  ").trim_end());
        }
        out
    }

    /// RFC 4180: a header line, then one line per row; a field with a comma,
    /// a quote or a line break is quoted, its quotes doubled.
    fn csv(&self) -> String {
        let field = |value: &str| {
            if value.contains([',', '"', '\n', '\r']) {
                format!("\"{}\"", value.replace('"', "\"\""))
            } else {
                value.to_owned()
            }
        };
        let mut out = self.columns.join(",") + "\r\n";
        for row in &self.rows {
            let line: Vec<String> = row.iter().map(|cell| field(&cell.text())).collect();
            out.push_str(&line.join(","));
            out.push_str("\r\n");
        }
        out
    }

    fn json(&self) -> String {
        let rows: Vec<serde_json::Value> = self
            .rows
            .iter()
            .map(|row| {
                let object = self.columns.iter().zip(row).map(|(name, cell)| ((*name).to_owned(), cell.json()));
                serde_json::Value::Object(object.collect())
            })
            .collect();
        serde_json::Value::Array(rows).to_string() + "\n"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table() -> Table {
        let mut table = Table::new(&["id", "units"]);
        table.push(vec!["a".into(), 5.into()]);
        table.push(vec!["b,\"c\"".into(), 1234.into()]);
        table
    }

    #[test]
    fn text_aligns_numbers_right_and_text_left() {
        assert_eq!(table().render(Format::Text), "ID     UNITS\na          5\nb,\"c\"   1234\n");
    }

    #[test]
    fn csv_quotes_what_needs_quoting() {
        assert_eq!(table().render(Format::Csv), "id,units\r\na,5\r\n\"b,\"\"c\"\"\",1234\r\n");
    }

    #[test]
    fn json_is_one_array_of_objects() {
        let json: serde_json::Value = serde_json::from_str(&table().render(Format::Json)).unwrap();
        assert_eq!(json, serde_json::json!([{"id": "a", "units": 5}, {"id": "b,\"c\"", "units": 1234}]));
        assert_eq!(Table::new(&["id"]).render(Format::Json), "[]\n");
    }
}
