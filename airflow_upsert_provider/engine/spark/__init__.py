"""Spark sessions (in process and Spark Connect), the Connect server and the class archive.

Owns how a SparkSession is obtained and configured. May import: engine.errors."""
