"""The pinned stack agrees with itself: pyspark and pyspark-client write the same package."""

from importlib.metadata import version


def test_pyspark_and_pyspark_client_are_the_same_version(spark):
    import pyspark

    assert version("pyspark") == version("pyspark-client") == pyspark.__version__
    # The JVM side (the jars) must match the Python side too.
    assert spark.version == pyspark.__version__
