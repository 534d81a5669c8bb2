//! The MiniMalloc CSV format: a header `id,lower,upper,size` and one buffer a row; a solved instance has a
//! fifth column, `offset`. The format is tiny, so the parser is written by hand: commas, no quoting.

use std::io::{BufRead, BufReader, Read, Write};
use std::path::PathBuf;

use crate::buffer::check_one;
use crate::{Buffer, PlanError};

const FIELDS: [&str; 4] = ["id", "lower", "upper", "size"];

/// The `.csv` files in `dirs` (a folder that cannot be read is skipped), sorted by file name, each name
/// once: the first folder's where several hold it (the repository's instances before `../shared`'s).
pub fn csv_files(dirs: &[PathBuf]) -> Vec<PathBuf> {
    let mut paths: Vec<PathBuf> = dirs
        .iter()
        .filter_map(|dir| std::fs::read_dir(dir).ok())
        .flatten()
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "csv"))
        .collect();
    // Stable: of two files of one name, the earlier folder's stays first, and dedup keeps it.
    paths.sort_by_key(|p| p.file_name().map(|n| n.to_owned()));
    paths.dedup_by_key(|p| p.file_name().map(|n| n.to_owned()));
    paths
}

/// Reads buffers from MiniMalloc CSV. The header must be `id,lower,upper,size`; an extra `offset` column (a
/// solved instance) is accepted and ignored. Blank lines are skipped, surrounding spaces and a `\r` are
/// trimmed. Errors name the line (the header is line 1).
pub fn read_csv(input: impl Read) -> Result<Vec<Buffer>, PlanError> {
    read_plan_csv(input).map(|(buffers, _)| buffers)
}

/// Like [`read_csv`], and also returns the `offset` column when the header has one (a solved instance, e.g.
/// MiniMalloc's output), so that a plan made elsewhere can be checked with [`crate::validate`].
pub fn read_plan_csv(input: impl Read) -> Result<(Vec<Buffer>, Option<Vec<u64>>), PlanError> {
    let mut lines = BufReader::new(input).lines();
    let header = loop {
        match lines.next() {
            None => return Err(PlanError::MissingHeader),
            Some(line) => {
                let line = line?;
                if !line.trim().is_empty() {
                    break line;
                }
            }
        }
    };
    let columns: Vec<&str> = header.trim().split(',').map(str::trim).collect();
    let with_offset = match columns.as_slice() {
        [a, b, c, d] if [*a, *b, *c, *d] == FIELDS => false,
        [a, b, c, d, "offset"] if [*a, *b, *c, *d] == FIELDS => true,
        _ => return Err(PlanError::BadHeader { line: 1, found: header.trim().to_string() }),
    };
    let expected = if with_offset { 5 } else { 4 };

    let mut buffers = Vec::new();
    let mut offsets = Vec::new();
    let mut ids = std::collections::HashSet::new();
    for (index, line) in lines.enumerate() {
        let number = index + 2;
        let line = line?;
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        let fields: Vec<&str> = line.split(',').map(str::trim).collect();
        if fields.len() != expected {
            return Err(PlanError::FieldCount { line: number, expected, found: fields.len() });
        }
        let mut values = [0u64; 4];
        for (slot, (name, text)) in values.iter_mut().zip(FIELDS.iter().zip(&fields)) {
            *slot = parse_field(number, name, text)?;
        }
        if with_offset {
            offsets.push(parse_field(number, "offset", fields[4])?);
        }
        let [id, lower, upper, size] = values;
        let buffer = Buffer { id, lower, upper, size };
        check_one(&buffer).map_err(|e| PlanError::Buffer { line: number, source: Box::new(e) })?;
        if !ids.insert(id) {
            return Err(PlanError::Buffer { line: number, source: Box::new(PlanError::DuplicateId { id }) });
        }
        buffers.push(buffer);
    }
    Ok((buffers, with_offset.then_some(offsets)))
}

fn parse_field(line: usize, field: &'static str, text: &str) -> Result<u64, PlanError> {
    if let Some(rest) = text.strip_prefix('-') {
        if !rest.is_empty() && rest.bytes().all(|c| c.is_ascii_digit()) {
            return Err(PlanError::Negative { line, field, value: text.to_string() });
        }
    }
    // `u64::from_str` accepts a leading `+`; the format does not.
    if text.is_empty() || !text.bytes().all(|c| c.is_ascii_digit()) {
        return Err(PlanError::NotANumber { line, field, value: text.to_string() });
    }
    text.parse::<u64>().map_err(|_| PlanError::TooLarge { line, field, value: text.to_string() })
}

/// Writes a solved instance in MiniMalloc's output format: `id,lower,upper,size,offset`, with a plan's
/// `offsets` (parallel to `buffers`).
pub fn write_plan_csv(mut out: impl Write, buffers: &[Buffer], offsets: &[u64]) -> Result<(), PlanError> {
    if offsets.len() != buffers.len() {
        return Err(PlanError::OffsetCount { buffers: buffers.len(), offsets: offsets.len() });
    }
    let mut text = String::with_capacity(32 * (buffers.len() + 1));
    text.push_str("id,lower,upper,size,offset\n");
    for (b, offset) in buffers.iter().zip(offsets) {
        use std::fmt::Write as _;
        let _ = writeln!(text, "{},{},{},{},{}", b.id, b.lower, b.upper, b.size, offset);
    }
    out.write_all(text.as_bytes())?;
    out.flush()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::greedy_by_size;

    fn read(text: &str) -> Result<Vec<Buffer>, PlanError> {
        read_csv(text.as_bytes())
    }

    #[test]
    fn csv_files_are_sorted_by_name_once_each_the_first_folders_copy_kept() {
        let root = std::env::temp_dir().join(format!("vrampool-csv-files-{}", std::process::id()));
        let (first, second) = (root.join("repo"), root.join("shared"));
        for (dir, names) in [(&first, ["b.csv", "a.csv", "notes.txt"]), (&second, ["b.csv", "c.csv", "d.json"])] {
            std::fs::create_dir_all(dir).unwrap();
            names.iter().for_each(|n| std::fs::write(dir.join(n), "").unwrap());
        }
        let found = csv_files(&[first.clone(), second.clone(), root.join("missing")]);
        std::fs::remove_dir_all(&root).unwrap();
        assert_eq!(found, vec![first.join("a.csv"), first.join("b.csv"), second.join("c.csv")]);
    }

    /// The error's message, which must name the line.
    fn message(text: &str) -> String {
        read(text).unwrap_err().to_string()
    }

    #[test]
    fn reads_the_minimalloc_format() {
        let buffers = read("id,lower,upper,size\n0,0,10,4\n1,5,15,8\n").unwrap();
        assert_eq!(buffers, vec![Buffer::new(0, 0, 10, 4), Buffer::new(1, 5, 15, 8)]);
    }

    #[test]
    fn tolerates_an_offset_column_blank_lines_spaces_and_crlf() {
        let text = "id, lower, upper, size, offset\r\n\r\n 0, 0, 10, 4, 0 \r\n1,5,15,8,4\r\n\n";
        let (buffers, offsets) = read_plan_csv(text.as_bytes()).unwrap();
        assert_eq!(buffers, vec![Buffer::new(0, 0, 10, 4), Buffer::new(1, 5, 15, 8)]);
        assert_eq!(offsets, Some(vec![0, 4]));
        assert_eq!(read_plan_csv("id,lower,upper,size\n0,0,1,1\n".as_bytes()).unwrap().1, None);
    }

    #[test]
    fn header_errors() {
        assert!(matches!(read(""), Err(PlanError::MissingHeader)));
        assert!(message("").contains("line 1"));
        assert!(message("id,lower,size,upper\n0,0,1,1\n").contains("line 1: bad header"));
        assert!(message("0,0,10,4\n").contains("line 1: bad header"));
        assert!(message("id,lower,upper,size,extra\n").contains("line 1"));
    }

    #[test]
    fn field_count_errors() {
        let m = message("id,lower,upper,size\n0,0,10,4\n1,5,15\n");
        assert!(m.contains("line 3") && m.contains("expected 4 fields, found 3"), "{m}");
        let m = message("id,lower,upper,size,offset\n0,0,10,4\n");
        assert!(m.contains("line 2") && m.contains("expected 5 fields, found 4"), "{m}");
        assert!(message("id,lower,upper,size\n0,0,10,4,0,1\n").contains("line 2"));
    }

    #[test]
    fn number_errors() {
        let m = message("id,lower,upper,size\n0,0,10,4\n1,x,15,8\n");
        assert!(m.contains("line 3") && m.contains("`lower`") && m.contains("`x`"), "{m}");
        let m = message("id,lower,upper,size\n0,0,10,-4\n");
        assert!(m.contains("line 2") && m.contains("negative") && m.contains("`size`"), "{m}");
        assert!(matches!(read("id,lower,upper,size\n0,0,10,-4\n"), Err(PlanError::Negative { line: 2, .. })));
        assert!(matches!(read("id,lower,upper,size\n0,0,1.5,4\n"), Err(PlanError::NotANumber { line: 2, .. })));
        assert!(matches!(read("id,lower,upper,size\n0,0,,4\n"), Err(PlanError::NotANumber { line: 2, .. })));
        assert!(matches!(read("id,lower,upper,size\n+1,0,3,4\n"), Err(PlanError::NotANumber { line: 2, .. })));
        assert!(matches!(read("id,lower,upper,size\n-,0,3,4\n"), Err(PlanError::NotANumber { line: 2, .. })));
        let m = message("id,lower,upper,size\n0,0,99999999999999999999,4\n");
        assert!(m.contains("line 2") && m.contains("64 bits"), "{m}");
        let m = message("id,lower,upper,size,offset\n0,0,10,4,q\n");
        assert!(m.contains("line 2") && m.contains("`offset`"), "{m}");
    }

    #[test]
    fn buffer_errors_name_the_line() {
        let m = message("id,lower,upper,size\n0,0,10,4\n\n1,10,10,8\n");
        assert!(m.starts_with("line 4:") && m.contains("empty lifetime"), "{m}");
        let m = message("id,lower,upper,size\n0,0,10,0\n");
        assert!(m.starts_with("line 2:") && m.contains("size is zero"), "{m}");
        let m = message("id,lower,upper,size\n5,0,10,4\n5,1,2,3\n");
        assert!(m.starts_with("line 3:") && m.contains("appears twice"), "{m}");
    }

    #[test]
    fn write_then_read_round_trips() {
        let buffers = vec![Buffer::new(10, 0, 4, 100), Buffer::new(11, 2, 6, 50), Buffer::new(12, 4, 9, 100)];
        let planned = greedy_by_size(&buffers, 1).unwrap();
        let mut out = Vec::new();
        write_plan_csv(&mut out, &buffers, &planned).unwrap();
        let text = String::from_utf8(out.clone()).unwrap();
        assert!(text.starts_with("id,lower,upper,size,offset\n"), "{text}");
        let (read_back, offsets) = read_plan_csv(out.as_slice()).unwrap();
        assert_eq!(read_back, buffers);
        assert_eq!(offsets.as_deref(), Some(planned.as_slice()));
        assert_eq!(read_csv(out.as_slice()).unwrap(), buffers);
        assert!(crate::validate(&read_back, &planned, 1).is_ok());
    }
}
