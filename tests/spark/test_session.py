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


def test_under_spark_submit_master_and_jars_are_left_to_spark_submit(monkeypatch) -> None:
    """A master given to build_session overrode spark-submit's --master (the job ran in local mode, silently), and
    jars given to it came too late for the driver's classpath: under spark-submit both are refused."""
    from bucketq import InvalidOption

    monkeypatch.setenv("PYSPARK_GATEWAY_PORT", "1")  # what spark-submit sets for the Python driver it starts
    with pytest.raises(InvalidOption, match=r"jars, master to spark-submit \(--jars, --master"):
        build_session(["x.jar"], master="local[2]")
    with pytest.raises(InvalidOption, match="python"):
        build_session(python="/usr/bin/python3")
