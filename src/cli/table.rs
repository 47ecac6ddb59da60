//! Aligned text columns, the way `kubectl get` prints them.

/// A table with a header row; every row has as many cells as the header.
#[derive(Debug, Clone, Default)]
pub struct Table {
    header: Vec<String>,
    rows: Vec<Vec<String>>,
}

impl Table {
    pub fn new(header: &[&str]) -> Self {
        Self {
            header: header.iter().map(|h| h.to_string()).collect(),
            rows: Vec::new(),
        }
    }

    /// Adds a row; missing cells print empty, extra cells are dropped.
    pub fn row(&mut self, cells: Vec<String>) {
        let mut cells = cells;
        cells.resize(self.header.len(), String::new());
        self.rows.push(cells);
    }

    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// Columns separated by three spaces, no trailing blanks, one line per row.
    pub fn render(&self) -> String {
        let mut widths: Vec<usize> = self.header.iter().map(|h| h.chars().count()).collect();
        for row in &self.rows {
            for (w, cell) in widths.iter_mut().zip(row) {
                *w = (*w).max(cell.chars().count());
            }
        }
        let mut out = String::new();
        for row in std::iter::once(&self.header).chain(&self.rows) {
            let mut line = String::new();
            for (i, (cell, w)) in row.iter().zip(&widths).enumerate() {
                if i > 0 {
                    line.push_str("   ");
                }
                line.push_str(cell);
                line.extend(std::iter::repeat_n(' ', w - cell.chars().count()));
            }
            out.push_str(line.trim_end());
            out.push('\n');
        }
        out
    }
}

/// A unit enum's serde name (`would-commit`) for the table.
pub fn serde_plain(v: &impl serde::Serialize) -> String {
    match serde_json::to_value(v) {
        Ok(serde_json::Value::String(s)) => s,
        _ => "?".into(),
    }
}

/// An age in milliseconds as `kubectl` prints ages: `45s`, `3m12s`, `2h5m`, `3d4h`.
pub fn age(ms: i64) -> String {
    let s = ms.max(0) / 1000;
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m{}s", s / 60, s % 60),
        3600..86400 => format!("{}h{}m", s / 3600, (s % 3600) / 60),
        _ => format!("{}d{}h", s / 86400, (s % 86400) / 3600),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_align_on_the_widest_cell() {
        let mut t = Table::new(&["GROUP", "OFFSET"]);
        t.row(vec!["billing".into(), "7".into()]);
        t.row(vec!["g".into(), "1234".into()]);
        assert_eq!(
            t.render(),
            "GROUP     OFFSET\nbilling   7\ng         1234\n"
        );
    }

    #[test]
    fn short_rows_are_padded() {
        let mut t = Table::new(&["A", "B", "C"]);
        t.row(vec!["x".into()]);
        assert_eq!(t.render(), "A   B   C\nx\n");
    }

    #[test]
    fn ages_read_like_kubectl() {
        assert_eq!(age(-5), "0s");
        assert_eq!(age(45_000), "45s");
        assert_eq!(age(192_000), "3m12s");
        assert_eq!(age(7_500_000), "2h5m");
        assert_eq!(age(273_600_000), "3d4h");
    }
}
