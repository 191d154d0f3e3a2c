//! Optimal rectangular assignment: the shortest-augmenting-path method (Crouse, 2016, a
//! Jonker-Volgenant variant without initialisation), the same algorithm and the same visiting
//! order as SciPy's `linear_sum_assignment`, which `trackers` uses.
//!
//! Written here rather than taken from a crate: `pathfinding`'s `kuhn_munkres` wants `Ord`
//! (integer) weights and no more rows than columns, `lapjv` wants a square `ndarray` matrix, and
//! neither breaks ties the way SciPy does. Ties are common in tracking (every non-overlapping
//! pair has IoU 0), and following SciPy's order keeps the tracker's choices identical to the
//! peer it is checked against.

/// A dense row-major matrix of weights, `rows x cols`.
#[derive(Debug, Clone, PartialEq)]
pub struct WeightMatrix {
    rows: usize,
    cols: usize,
    weights: Vec<f64>,
}

impl WeightMatrix {
    /// Builds the matrix from `weight(row, col)`.
    pub fn from_fn(rows: usize, cols: usize, mut weight: impl FnMut(usize, usize) -> f64) -> Self {
        let mut weights = Vec::with_capacity(rows * cols);
        for r in 0..rows {
            for c in 0..cols {
                weights.push(weight(r, c));
            }
        }
        Self { rows, cols, weights }
    }

    pub fn get(&self, row: usize, col: usize) -> f64 {
        self.weights[row * self.cols + col]
    }
}

/// The `(row, col)` pairs of an assignment of `min(rows, cols)` pairs that maximises the total
/// weight, sorted by row. Weights must be finite.
pub fn maximum_weight_assignment(matrix: &WeightMatrix) -> Vec<(usize, usize)> {
    if matrix.rows == 0 || matrix.cols == 0 {
        return Vec::new();
    }
    // The solver needs rows <= cols: a tall matrix is solved transposed. Maximising is
    // minimising the negated weights.
    let transpose = matrix.cols < matrix.rows;
    let (rows, cols) = if transpose {
        (matrix.cols, matrix.rows)
    } else {
        (matrix.rows, matrix.cols)
    };
    let cost = |r: usize, c: usize| {
        if transpose {
            -matrix.get(c, r)
        } else {
            -matrix.get(r, c)
        }
    };
    let col_for_row = ShortestAugmentingPath::new(rows, cols).solve(cost);
    let mut pairs: Vec<(usize, usize)> = col_for_row
        .into_iter()
        .enumerate()
        .map(|(r, c)| if transpose { (c, r) } else { (r, c) })
        .collect();
    pairs.sort_unstable();
    pairs
}

/// Working state of one solve, rows <= cols.
struct ShortestAugmentingPath {
    rows: usize,
    cols: usize,
    row_dual: Vec<f64>,
    col_dual: Vec<f64>,
    path: Vec<usize>,
    col_for_row: Vec<Option<usize>>,
    row_for_col: Vec<Option<usize>>,
    shortest_path_costs: Vec<f64>,
    rows_scanned: Vec<bool>,
    cols_scanned: Vec<bool>,
    remaining: Vec<usize>,
}

impl ShortestAugmentingPath {
    fn new(rows: usize, cols: usize) -> Self {
        Self {
            rows,
            cols,
            row_dual: vec![0.0; rows],
            col_dual: vec![0.0; cols],
            path: vec![0; cols],
            col_for_row: vec![None; rows],
            row_for_col: vec![None; cols],
            shortest_path_costs: vec![f64::INFINITY; cols],
            rows_scanned: vec![false; rows],
            cols_scanned: vec![false; cols],
            remaining: vec![0; cols],
        }
    }

    /// The column of each row in a minimum-cost assignment.
    fn solve(mut self, cost: impl Fn(usize, usize) -> f64) -> Vec<usize> {
        for current_row in 0..self.rows {
            let (sink, min_value) = self.augmenting_path(&cost, current_row);
            self.update_duals(current_row, min_value);
            // Flip the path's edges, from the sink back to the current row.
            let mut col = sink;
            loop {
                let row = self.path[col];
                self.row_for_col[col] = Some(row);
                let previous = self.col_for_row[row].replace(col);
                if row == current_row {
                    break;
                }
                col = previous.expect("rows on an augmenting path other than its start are assigned");
            }
        }
        self.col_for_row
            .into_iter()
            .map(|c| c.expect("every row is assigned when rows <= cols"))
            .collect()
    }

    /// Dijkstra over reduced costs from `start_row` to the nearest unassigned column; returns
    /// that column and the path's length.
    fn augmenting_path(&mut self, cost: &impl Fn(usize, usize) -> f64, start_row: usize) -> (usize, f64) {
        let mut min_value = 0.0;
        // Filled in reverse so that a constant matrix yields the identity (as SciPy does).
        for (i, slot) in self.remaining.iter_mut().enumerate() {
            *slot = self.cols - i - 1;
        }
        let mut num_remaining = self.cols;
        self.rows_scanned.fill(false);
        self.cols_scanned.fill(false);
        self.shortest_path_costs.fill(f64::INFINITY);
        let mut row = start_row;
        loop {
            let mut index = 0;
            let mut lowest = f64::INFINITY;
            self.rows_scanned[row] = true;
            for (it, &col) in self.remaining[..num_remaining].iter().enumerate() {
                let reduced = min_value + cost(row, col) - self.row_dual[row] - self.col_dual[col];
                if reduced < self.shortest_path_costs[col] {
                    self.path[col] = row;
                    self.shortest_path_costs[col] = reduced;
                }
                // Among equally short, prefer a free column: it ends the search.
                let candidate = self.shortest_path_costs[col];
                if candidate < lowest || (candidate == lowest && self.row_for_col[col].is_none()) {
                    lowest = candidate;
                    index = it;
                }
            }
            min_value = lowest;
            let col = self.remaining[index];
            self.cols_scanned[col] = true;
            num_remaining -= 1;
            self.remaining[index] = self.remaining[num_remaining];
            match self.row_for_col[col] {
                None => return (col, min_value),
                Some(next) => row = next,
            }
        }
    }

    fn update_duals(&mut self, current_row: usize, min_value: f64) {
        self.row_dual[current_row] += min_value;
        for row in 0..self.rows {
            if self.rows_scanned[row] && row != current_row {
                let col = self.col_for_row[row].expect("scanned rows other than the start are assigned");
                self.row_dual[row] += min_value - self.shortest_path_costs[col];
            }
        }
        for col in 0..self.cols {
            if self.cols_scanned[col] {
                self.col_dual[col] -= min_value - self.shortest_path_costs[col];
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn total(matrix: &WeightMatrix, pairs: &[(usize, usize)]) -> f64 {
        pairs.iter().map(|&(r, c)| matrix.get(r, c)).sum()
    }

    /// The best total over every injective map of the shorter side into the longer one.
    fn brute_force_best(matrix: &WeightMatrix) -> f64 {
        fn search(m: &WeightMatrix, row: usize, used: &mut Vec<bool>, transpose: bool) -> f64 {
            let (rows, cols) = if transpose {
                (m.cols, m.rows)
            } else {
                (m.rows, m.cols)
            };
            if row == rows {
                return 0.0;
            }
            let mut best = f64::NEG_INFINITY;
            for col in 0..cols {
                if !used[col] {
                    used[col] = true;
                    let w = if transpose {
                        m.get(col, row)
                    } else {
                        m.get(row, col)
                    };
                    best = best.max(w + search(m, row + 1, used, transpose));
                    used[col] = false;
                }
            }
            best
        }
        let transpose = matrix.cols < matrix.rows;
        let longer = matrix.rows.max(matrix.cols);
        search(matrix, 0, &mut vec![false; longer], transpose)
    }

    #[test]
    fn beats_greedy_where_greedy_fails() {
        // Greedy takes (0, 0) = 0.9 first and is left with (1, 1) = 0.1: total 1.0.
        // The optimum pairs (0, 1) and (1, 0): 0.8 + 0.8 = 1.6.
        let m = WeightMatrix::from_fn(2, 2, |r, c| [[0.9, 0.8], [0.8, 0.1]][r][c]);
        assert_eq!(maximum_weight_assignment(&m), vec![(0, 1), (1, 0)]);
    }

    #[test]
    fn rectangular_both_ways_pick_the_best_subset() {
        let wide = WeightMatrix::from_fn(2, 4, |r, c| [[0.1, 0.2, 0.9, 0.0], [0.0, 0.7, 0.8, 0.3]][r][c]);
        assert_eq!(maximum_weight_assignment(&wide), vec![(0, 2), (1, 1)]);
        let tall = WeightMatrix::from_fn(4, 2, |r, c| wide.get(c, r));
        assert_eq!(maximum_weight_assignment(&tall), vec![(1, 1), (2, 0)]);
    }

    #[test]
    fn empty_sides_give_no_pairs() {
        assert!(maximum_weight_assignment(&WeightMatrix::from_fn(0, 3, |_, _| 1.0)).is_empty());
        assert!(maximum_weight_assignment(&WeightMatrix::from_fn(3, 0, |_, _| 1.0)).is_empty());
    }

    #[test]
    fn constant_matrix_gives_the_identity_like_scipy() {
        let m = WeightMatrix::from_fn(3, 3, |_, _| 0.0);
        assert_eq!(maximum_weight_assignment(&m), vec![(0, 0), (1, 1), (2, 2)]);
    }

    #[test]
    fn matches_brute_force_on_random_matrices() {
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state >> 11) as f64 / (1u64 << 53) as f64
        };
        for case in 0..300 {
            let rows = 1 + case % 5;
            let cols = 1 + (case / 5) % 6;
            // A third of the entries are 0, as for boxes that do not overlap.
            let m = WeightMatrix::from_fn(rows, cols, |_, _| {
                let w = next();
                if w < 0.33 {
                    0.0
                } else {
                    w
                }
            });
            let pairs = maximum_weight_assignment(&m);
            assert_eq!(pairs.len(), rows.min(cols), "case {case}");
            let mut cols_used: Vec<usize> = pairs.iter().map(|p| p.1).collect();
            cols_used.sort_unstable();
            cols_used.dedup();
            assert_eq!(cols_used.len(), pairs.len(), "case {case}: a column used twice");
            let best = brute_force_best(&m);
            assert!(
                (total(&m, &pairs) - best).abs() < 1e-9,
                "case {case}: {} vs {best}",
                total(&m, &pairs)
            );
        }
    }
}
