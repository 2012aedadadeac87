//! Plain text tables for every report of `espgw` and its benchmarks:
//! columns as wide as their widest cell, so that a long name keeps the
//! table aligned (hand-kept `{:<N}` widths did not).
//!
//! Owns: the one table style (no borders, no wrapping, numbers
//! right-aligned). Must not: decide what a table shows; the reports do.

use std::fmt::Write as _;

use comfy_table::{CellAlignment, ContentArrangement, Table};

/// A table with `header`, the columns numbered in `right_aligned`
/// right-aligned.
pub fn plain_table(header: &[&str], right_aligned: &[usize]) -> Table {
    let mut table = Table::new();
    table
        .load_style(comfy_table::presets::NOTHING)
        .set_content_arrangement(ContentArrangement::Disabled)
        .set_header(header.iter().copied());
    for &i in right_aligned {
        if let Some(column) = table.column_mut(i) {
            column.set_cell_alignment(CellAlignment::Right);
        }
    }
    table
}

/// A table's lines without the padding the style leaves at their ends.
pub fn table_text(table: &Table) -> String {
    let mut out = String::new();
    for line in table.lines() {
        let _ = writeln!(out, "{}", line.trim_end());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A cell longer than any hand-kept width still leaves every column
    /// aligned: right-aligned numbers end where their header ends.
    #[test]
    fn a_long_cell_keeps_the_columns_aligned() {
        let mut table = plain_table(&["name", "value"], &[1]);
        table.add_row(["short", "1"]);
        table.add_row(["a name much longer than twenty characters", "12345"]);
        let text = table_text(&table);
        let lines: Vec<&str> = text.lines().collect();
        let end = |line: &str, cell: &str| line.find(cell).map(|at| at + cell.len());
        let column = end(lines[0], "value").unwrap();
        assert_eq!(end(lines[1], "1"), Some(column), "{text}");
        assert_eq!(end(lines[2], "12345"), Some(column), "{text}");
        assert!(text.lines().all(|l| l == l.trim_end()), "{text}");
    }
}
