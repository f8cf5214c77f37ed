"""``python -m bench``: run every benchmark and print its figures beside its baseline."""

from bench import stream_throughput

if __name__ == "__main__":
    print(stream_throughput.report(stream_throughput.measure()))
