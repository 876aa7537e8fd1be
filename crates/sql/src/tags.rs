//! SQLCommenter tags: the `key='value'` pairs a client writes about a statement in its
//! comments, which classifiers route on (`tag('team') = 'billing'`).

/// The tags of a statement: the `key='value'` pairs of its `/* … */` comments, as
/// [SQLCommenter](https://google.github.io/sqlcommenter/spec/) writes them (`,`-separated,
/// values single-quoted, `\'` for a quote, keys and values %-encoded; spaces around them are
/// allowed). Comments inside string literals are not comments; a piece that is not
/// `key=value` is skipped; the first value of a key wins. Tags are what the client says about
/// itself: route on them, but trust `user` for anything a client must not choose.
pub fn tags(text: &str) -> Vec<(String, String)> {
    // Only a text with a comment is lexed at all.
    if !text.contains("/*") {
        return Vec::new();
    }
    #[derive(Default)]
    struct Comments(Vec<std::ops::Range<usize>>);
    impl crate::lexer::Tokens for Comments {
        fn token(&mut self, _kind: crate::lexer::TokenKind, _span: std::ops::Range<usize>) {}
        fn comment(&mut self, span: std::ops::Range<usize>) {
            self.0.push(span);
        }
    }
    let mut comments = Comments::default();
    crate::lexer::lex(text, &mut comments);
    tags_of_comments(text, &comments.0)
}

/// The tags in the `/* … */` comments at `spans` of `text` (see [`tags`]).
pub(crate) fn tags_of_comments(
    text: &str,
    spans: &[std::ops::Range<usize>],
) -> Vec<(String, String)> {
    let mut tags: Vec<(String, String)> = Vec::new();
    for span in spans {
        let Some(comment) = text.get(span.clone()) else {
            continue;
        };
        let inner = comment
            .strip_prefix("/*")
            .map(|c| c.strip_suffix("*/").unwrap_or(c))
            .unwrap_or("");
        for (k, v) in comment_tags(inner) {
            if !tags.iter().any(|(have, _)| *have == k) {
                tags.push((k, v));
            }
        }
    }
    tags
}

/// `key='value', key2='v2'` → pairs; pieces that are not `key=value` are skipped.
fn comment_tags(inner: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let bytes = inner.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        // One piece: up to a `,` outside quotes.
        let start = i;
        let mut quoted = false;
        while i < bytes.len() {
            match bytes[i] {
                b'\\' if quoted => i += 1,
                b'\'' => quoted = !quoted,
                b',' if !quoted => break,
                _ => {}
            }
            i += 1;
        }
        let piece = &inner[start..i.min(inner.len())];
        i += 1;
        let Some((key, value)) = piece.split_once('=') else {
            continue;
        };
        let key = key.trim();
        let value = value.trim();
        if key.is_empty() || key.contains(char::is_whitespace) {
            continue;
        }
        let value = match value.strip_prefix('\'') {
            Some(v) => match v.strip_suffix('\'') {
                Some(v) => v.replace("\\'", "'"),
                None => continue,
            },
            None if !value.is_empty() && !value.contains(char::is_whitespace) => value.to_string(),
            None => continue,
        };
        out.push((percent_decode(key), percent_decode(&value)));
    }
    out
}

/// `%XX` → the byte; anything else as written (invalid UTF-8 is replaced).
fn percent_decode(s: &str) -> String {
    if !s.contains('%') {
        return s.to_string();
    }
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| (b as char).to_digit(16);
        if bytes[i] == b'%' && i + 2 < bytes.len() {
            if let (Some(h), Some(l)) = (hex(bytes[i + 1]), hex(bytes[i + 2])) {
                out.push((h * 16 + l) as u8);
                i += 3;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags_come_from_sqlcommenter_comments_only() {
        let t = tags("SELECT 1 /*team='billing',route='%2Fapi%2Fv1',quote='it\\'s'*/");
        assert_eq!(
            t,
            [
                ("team".to_string(), "billing".to_string()),
                ("route".to_string(), "/api/v1".to_string()),
                ("quote".to_string(), "it's".to_string())
            ]
        );
        assert_eq!(
            tags("/* team = 'ops' */ SELECT 1 /* team='other', just a note */"),
            [("team".to_string(), "ops".to_string())]
        );
        assert!(tags("SELECT '/* team=''billing'' */'").is_empty());
        assert!(tags("SELECT 1 -- team='billing'").is_empty());
        assert!(tags("SELECT 1 /* unterminated team='x'").len() <= 1);
        assert_eq!(
            tags("SELECT 1 /*a=1,b='%zz'*/"),
            [
                ("a".to_string(), "1".to_string()),
                ("b".to_string(), "%zz".to_string())
            ]
        );
    }
}
