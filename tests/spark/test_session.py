"""Where ``bucketq_spark`` takes the connector's jars from: the caller or ``$BUCKETQ_SPARK_JARS``, never the
checkout (no JVM is started here)."""

from __future__ import annotations

import pytest

from bucketq_spark.session import JARS_ENV, build_session, default_jars, expand_jars

pytestmark = pytest.mark.spark


def test_without_jars_the_error_says_how_to_get_them(monkeypatch, tmp_path) -> None:
    monkeypatch.delenv(JARS_ENV, raising=False)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(FileNotFoundError, match=r"\$BUCKETQ_SPARK_JARS is not set.*make jars"):
        default_jars()
    monkeypatch.setenv(JARS_ENV, str(tmp_path))
    with pytest.raises(FileNotFoundError, match="names no jar"):
        default_jars()
    with pytest.raises(FileNotFoundError, match="no jar in"):
        build_session([tmp_path])


def test_jars_from_directories_and_files(monkeypatch, tmp_path) -> None:
    one, two = tmp_path / "a", tmp_path / "b"
    one.mkdir()
    two.mkdir()
    for path in (one / "y.jar", one / "x.jar", one / "notes.txt", two / "z.jar"):
        path.write_text("")
    assert expand_jars([one, two / "z.jar"]) == [one / "x.jar", one / "y.jar", two / "z.jar"]
    monkeypatch.setenv(JARS_ENV, f"{one},{two / 'z.jar'}")
    assert default_jars() == [one / "x.jar", one / "y.jar", two / "z.jar"]
    monkeypatch.setenv(JARS_ENV, f"{two}:{one / 'x.jar'}")
    assert default_jars() == [two / "z.jar", one / "x.jar"]
