//! URL parts built by hand (an API path, a query value, an Iceberg REST table
//! path): one encoding for all of them.

use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};

/// Everything but RFC 3986's unreserved characters is escaped.
const COMPONENT: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

/// `s` as one path segment or query value.
pub fn component(s: &str) -> String {
    utf8_percent_encode(s, COMPONENT).to_string()
}

#[cfg(test)]
mod tests {
    #[test]
    fn only_unreserved_characters_pass() {
        assert_eq!(super::component("a-Z_0.~"), "a-Z_0.~");
        assert_eq!(
            super::component("dt=2026/11 ü&x"),
            "dt%3D2026%2F11%20%C3%BC%26x"
        );
    }
}
