//! Reading order of boxes on a page: rows by vertical overlap, top to bottom, then left to right in a
//! row; and the plain text of OCR lines in that order.

/// A box joins a row when at least this share of its height lies within the row's vertical extent: half
/// keeps words of one line together when the line is slanted or the words differ in height (ascenders,
/// capitals), and keeps two stacked lines apart (they overlap by a few pixels at most).
pub const ROW_OVERLAP: f64 = 0.5;

/// Rows of indices into `boxes` (`[x1, y1, x2, y2]`), top to bottom, each left to right.
pub fn rows(boxes: &[[f64; 4]]) -> Vec<Vec<usize>> {
    let mut by_top: Vec<usize> = (0..boxes.len()).collect();
    by_top.sort_by(|&a, &b| {
        let (a, b) = (&boxes[a], &boxes[b]);
        a[1].total_cmp(&b[1]).then(a[0].total_cmp(&b[0]))
    });
    // (top, bottom, members) of each row, in the order rows start.
    let mut rows: Vec<(f64, f64, Vec<usize>)> = Vec::new();
    for i in by_top {
        let [_, y1, _, y2] = boxes[i];
        let height = (y2 - y1).max(f64::EPSILON);
        let row = rows.iter_mut().find(|(top, bottom, _)| {
            let shared = y2.min(*bottom) - y1.max(*top);
            shared / height >= ROW_OVERLAP
        });
        match row {
            Some((top, bottom, members)) => {
                *top = top.min(y1);
                *bottom = bottom.max(y2);
                members.push(i);
            }
            None => rows.push((y1, y2, vec![i])),
        }
    }
    rows.into_iter()
        .map(|(_, _, mut members)| {
            members.sort_by(|&a, &b| boxes[a][0].total_cmp(&boxes[b][0]));
            members
        })
        .collect()
}

/// Indices into `boxes` in reading order.
pub fn reading_order(boxes: &[[f64; 4]]) -> Vec<usize> {
    rows(boxes).into_iter().flatten().collect()
}

/// The plain text of lines at `boxes`: the lines of a row joined by a space, rows by a line break.
pub fn plain_text(boxes: &[[f64; 4]], labels: &[String]) -> String {
    rows(boxes)
        .iter()
        .map(|row| {
            row.iter()
                .filter_map(|&i| labels.get(i).map(|l| l.trim()))
                .filter(|l| !l.is_empty())
                .collect::<Vec<_>>()
                .join(" ")
        })
        .filter(|line| !line.is_empty())
        .collect::<Vec<_>>()
        .join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_go_top_down_and_left_to_right() {
        let boxes = [
            [50.0, 12.0, 90.0, 30.0], // row 1, right (a little lower than its neighbour)
            [0.0, 100.0, 40.0, 120.0], // row 3
            [0.0, 10.0, 40.0, 28.0],  // row 1, left
            [60.0, 50.0, 99.0, 70.0], // row 2
        ];
        assert_eq!(rows(&boxes), vec![vec![2, 0], vec![3], vec![1]]);
        let labels: Vec<String> = ["WORLD", "EXIT", "HELLO", "CAFE"].map(String::from).into();
        assert_eq!(plain_text(&boxes, &labels), "HELLO WORLD\nCAFE\nEXIT");
    }

    #[test]
    fn stacked_lines_touching_by_a_few_pixels_are_two_rows() {
        let boxes = [[0.0, 0.0, 50.0, 20.0], [0.0, 18.0, 50.0, 38.0]];
        assert_eq!(rows(&boxes), vec![vec![0], vec![1]]);
        assert!(rows(&[]).is_empty());
    }
}
