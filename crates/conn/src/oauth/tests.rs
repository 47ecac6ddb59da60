use std::net::TcpListener;

use super::*;

fn oauth(url: &str, allow_loopback: bool) -> OAuth {
    OAuth::new(
        url.into(),
        "client".into(),
        "s3cret".into(),
        Some("kafka read".into()),
        vec![("logicalCluster".into(), "lkc-1".into())],
        allow_loopback,
    )
}

/// A one-shot endpoint on loopback answering `answer`; returns its URL and what it was sent.
fn endpoint(answer: Vec<u8>) -> (String, std::thread::JoinHandle<Vec<u8>>) {
    let listener = TcpListener::bind("127.0.0.1:0").expect("a port");
    let port = listener.local_addr().expect("bound").port();
    let served = std::thread::spawn(move || {
        let Ok((mut s, _)) = listener.accept() else {
            return Vec::new();
        };
        let mut request = vec![0u8; 4096];
        let n = s.read(&mut request).unwrap_or(0);
        request.truncate(n);
        let _ = s.write_all(&answer);
        request
    });
    (format!("http://127.0.0.1:{port}/oauth/token"), served)
}

#[test]
fn urls_split_into_scheme_host_port_and_path() {
    let e = parse_endpoint("https://idp.example.com/realms/x/token?a=b#f").expect("valid");
    assert_eq!(
        (e.tls, e.host, e.port, e.authority, e.path),
        (
            true,
            "idp.example.com",
            443,
            "idp.example.com",
            "/realms/x/token?a=b"
        )
    );
    let e = parse_endpoint("http://[::1]:8080").expect("valid");
    assert_eq!((e.tls, e.host, e.port, e.path), (false, "::1", 8080, "/"));
    for bad in [
        "ftp://x/t",
        "https://",
        "https://u:p@idp/t",
        "https://idp:99999/t",
    ] {
        assert!(parse_endpoint(bad).is_err(), "{bad}");
    }
}

#[test]
fn the_operator_calls_no_local_address_and_no_plain_http() {
    for local in [
        "127.0.0.1",
        "169.254.169.254",
        "::1",
        "fe80::1",
        "0.0.0.0",
        "::ffff:127.0.0.1",
    ] {
        assert!(is_local(local.parse().expect("an address")), "{local}");
    }
    assert!(!is_local("10.0.0.1".parse().expect("an address")));
    let local = parse_endpoint("https://127.0.0.1:8443/t").expect("valid");
    assert!(
        checked_address(&local, &oauth("", false)).is_err(),
        "loopback over https"
    );
    assert!(checked_address(&local, &oauth("", true)).is_ok(), "allowed");
    let metadata = parse_endpoint("http://169.254.169.254/latest").expect("valid");
    assert!(
        checked_address(&metadata, &oauth("", true)).is_err(),
        "http to link-local, even allowed"
    );
    let plain = parse_endpoint("http://10.0.0.1/t").expect("valid");
    let err = checked_address(&plain, &oauth("", true)).expect_err("http off loopback");
    assert!(err.to_string().contains("https"), "{err}");
}

/// N12: the installer's address bound holds for the token endpoint as for the brokers.
#[test]
fn a_token_endpoint_outside_the_installers_addresses_is_not_called() {
    let ten = crate::AddressCheck::new(|ip| match ip {
        std::net::IpAddr::V4(v4) if v4.octets()[0] == 10 => Ok(()),
        other => Err(format!("{other} is outside 10.0.0.0/8")),
    });
    let inside = parse_endpoint("https://10.0.0.1/t").expect("valid");
    let outside = parse_endpoint("https://192.0.2.1/t").expect("valid");
    let bounded = oauth("", false).with_address_check(Some(ten));
    assert!(checked_address(&inside, &bounded).is_ok());
    let err = checked_address(&outside, &bounded).expect_err("refused");
    assert!(err.to_string().contains("installer"), "{err}");
    assert!(
        checked_address(&outside, &oauth("", false)).is_ok(),
        "unbounded"
    );
}

#[test]
fn a_token_is_fetched_with_basic_credentials_and_the_form() {
    let body = r#"{"access_token":"eyJ.abc.def","token_type":"Bearer","expires_in":60}"#;
    let answer = format!(
        "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    let (url, served) = endpoint(answer.into_bytes());
    let (token, lifetime) = fetch_token(&oauth(&url, true), Duration::from_secs(5)).expect("token");
    assert_eq!(
        (token.as_str(), lifetime),
        ("eyJ.abc.def", Duration::from_secs(60))
    );
    let request = String::from_utf8(served.join().expect("served")).expect("text");
    assert!(
        request.starts_with("POST /oauth/token HTTP/1.1\r\n"),
        "{request}"
    );
    assert!(request.contains(&format!(
        "Authorization: Basic {}",
        base64(b"client:s3cret")
    )));
    assert!(
        request.ends_with("grant_type=client_credentials&scope=kafka+read"),
        "{request}"
    );
    // Not allowed to call loopback: refused before connecting.
    assert!(fetch_token(&oauth(&url, false), Duration::from_secs(5)).is_err());
}

#[test]
fn an_error_answer_is_named_by_its_status_and_its_body_is_never_copied() {
    let body = format!("MARKER{}", "x".repeat(1000));
    let answer = format!(
        "HTTP/1.1 401 Unauthorized\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    let (url, _served) = endpoint(answer.into_bytes());
    let err = fetch_token(&oauth(&url, true), Duration::from_secs(5)).expect_err("401");
    assert_eq!(
        err.to_string(),
        "OAuth token: the token endpoint answered 401"
    );
    // A known OAuth error code is named; anything else in the body is not.
    let refused: &[u8] = b"HTTP/1.1 400 Bad Request\r\n\r\n{\"error\":\"invalid_client\",\"error_description\":\"MARKER\"}";
    let err = token_of(refused).expect_err("400");
    assert_eq!(
        err.to_string(),
        "OAuth token: the token endpoint answered 400 (invalid_client)"
    );
    let made_up: &[u8] = b"HTTP/1.1 400 Bad Request\r\n\r\n{\"error\":\"MARKER\"}";
    assert!(
        !token_of(made_up)
            .expect_err("400")
            .to_string()
            .contains("MARKER")
    );
}

#[test]
fn an_answer_over_64_kib_is_refused_as_it_is_read() {
    let mut answer = b"HTTP/1.1 400 Bad Request\r\n\r\n".to_vec();
    answer.extend(vec![b'x'; 10 << 20]);
    let (url, _served) = endpoint(answer);
    let err = fetch_token(&oauth(&url, true), Duration::from_secs(5)).expect_err("too large");
    assert!(err.to_string().contains("larger than 65536 bytes"), "{err}");
}

#[test]
fn chunked_and_malformed_answers() {
    let ok = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n10\r\n{\"access_token\":\r\n5\r\n\"t1\"}\r\n0\r\n\r\n";
    assert_eq!(token_of(ok).expect("chunked").0, "t1");
    for bad in [
        &b"garbage"[..],
        b"HTTP/1.1 200 OK\r\n\r\nnot json",
        b"HTTP/1.1 200 OK\r\n\r\n{\"token\":\"x\"}",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nffffffff\r\nab",
    ] {
        assert!(token_of(bad).is_err(), "{}", String::from_utf8_lossy(bad));
    }
}

#[test]
fn the_sasl_message_carries_the_token_and_extensions() {
    let m = oauth("https://idp/t", false).client_message("tok");
    assert_eq!(m, b"n,,\x01auth=Bearer tok\x01logicalCluster=lkc-1\x01\x01");
    assert_eq!(base64(b"a"), "YQ==");
    assert_eq!(base64(b"ab"), "YWI=");
    assert_eq!(base64(b"abc"), "YWJj");
}
