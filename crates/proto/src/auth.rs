//! Where an API key travels in a request: `X-API-KEY`, else `Authorization: Bearer <key>`.
//! One rule for the daemon's REST routes and its MCP server, so the two cannot disagree.

/// The API key of a request whose header values `header(name)` gives (lower-case names):
/// `X-API-KEY` when present and not blank, else the token of `Authorization: Bearer`.
/// Other `Authorization` schemes carry no key.
pub fn api_key<'a>(header: impl Fn(&str) -> Option<&'a str>) -> Option<&'a str> {
    let value = |name: &str| header(name).map(str::trim).filter(|v| !v.is_empty());
    let bearer = value("authorization").and_then(|v| {
        v.split_once(' ')
            .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
            .map(|(_, token)| token.trim())
            .filter(|token| !token.is_empty())
    });
    value("x-api-key").or(bearer)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key_of<'a>(headers: &'a [(&'a str, &'a str)]) -> Option<&'a str> {
        api_key(|name| headers.iter().find(|(n, _)| *n == name).map(|(_, v)| *v))
    }

    #[test]
    fn keys_come_from_either_header_x_api_key_first() {
        assert_eq!(key_of(&[]), None);
        assert_eq!(
            key_of(&[("authorization", "Bearer e2b_abc")]),
            Some("e2b_abc")
        );
        assert_eq!(
            key_of(&[("authorization", "bearer  e2b_abc ")]),
            Some("e2b_abc")
        );
        assert_eq!(
            key_of(&[
                ("authorization", "Bearer e2b_abc"),
                ("x-api-key", "e2b_def")
            ]),
            Some("e2b_def")
        );
        assert_eq!(
            key_of(&[("authorization", "Bearer e2b_abc"), ("x-api-key", "  ")]),
            Some("e2b_abc")
        );
    }

    #[test]
    fn other_schemes_and_empty_tokens_carry_no_key() {
        assert_eq!(key_of(&[("authorization", "Basic dXNlcjo=")]), None);
        assert_eq!(key_of(&[("authorization", "Bearer ")]), None);
        assert_eq!(key_of(&[("authorization", "e2b_abc")]), None);
    }
}
