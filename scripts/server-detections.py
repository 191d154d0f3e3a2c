#!/usr/bin/env python3
"""Posts each image to a running server's /v1/detect and prints one JSON line per image in
`peregrine detect`'s shape ({"image": ..., "detections": [...]}), for
scripts/compare-detections.py: parity of one server configuration with another.

    scripts/server-detections.py URL IMAGE... > detections.jsonl
"""
import json
import sys
import urllib.request


def main():
    url = sys.argv[1].rstrip("/") + "/v1/detect"
    for path in sys.argv[2:]:
        body = open(path, "rb").read()
        req = urllib.request.Request(url, data=body, headers={"content-type": "application/octet-stream"})
        with urllib.request.urlopen(req, timeout=60) as resp:
            answer = json.load(resp)
        print(json.dumps({"image": path, "detections": answer["detections"]}))


if __name__ == "__main__":
    main()
