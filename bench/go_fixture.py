#!/usr/bin/env python3
"""A static Go module proxy and a module locked against it, for the cache tests and bench.

go_fixture.py REGISTRY_DIR PROJECT_DIR COUNT

Writes COUNT modules (example.com/h5ifixture/m000 ...), each served as the GOPROXY protocol
lays it out (MODULE/@v/list, VER.info, VER.mod, VER.zip: a real module zip with the
`MODULE@VER/` prefix; package mNNN with `const Value = NNN + 1`). PROJECT_DIR gets go.mod (a
main module requiring every one), go.sum (the h1: dirhash of each zip and go.mod, computed as
Go does) and main.go printing the last module's Value. The proxy URL is not in the project: Go
takes it from the host's GOPROXY, as `h5i box cache refresh go` does. Deterministic; no network.
"""
import base64, hashlib, io, json, os, sys, zipfile

reg, proj, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
VER = "v1.0.0"


def h1(files):
    """Go's dirhash.Hash1 over (name, bytes) pairs."""
    summary = "".join("%s  %s\n" % (hashlib.sha256(d).hexdigest(), n) for n, d in sorted(files))
    return "h1:" + base64.b64encode(hashlib.sha256(summary.encode()).digest()).decode()


requires, sums, mods = [], [], []
for i in range(count):
    path = "example.com/h5ifixture/m%03d" % i
    gomod = ("module %s\n\ngo 1.19\n" % path).encode()
    src = ("package m%03d\n\nconst Value = %d\n" % (i, i + 1)).encode()
    prefix = "%s@%s/" % (path, VER)
    files = [(prefix + "go.mod", gomod), (prefix + "m.go", src)]
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        for n, d in files:
            z.writestr(zipfile.ZipInfo(n, date_time=(2020, 1, 1, 0, 0, 0)), d)
    v = os.path.join(reg, path, "@v")
    os.makedirs(v, exist_ok=True)
    with open(os.path.join(v, "list"), "w") as f:
        f.write(VER + "\n")
    with open(os.path.join(v, VER + ".info"), "w") as f:
        json.dump({"Version": VER, "Time": "2020-01-01T00:00:00Z"}, f)
    with open(os.path.join(v, VER + ".mod"), "wb") as f:
        f.write(gomod)
    with open(os.path.join(v, VER + ".zip"), "wb") as f:
        f.write(buf.getvalue())
    requires.append("\t%s %s\n" % (path, VER))
    sums.append("%s %s %s\n" % (path, VER, h1(files)))
    sums.append("%s %s/go.mod %s\n" % (path, VER, h1([("go.mod", gomod)])))
    mods.append(path)
with open(os.path.join(proj, "go.mod"), "w") as f:
    f.write("module example.com/fixtureapp\n\ngo 1.19\n\nrequire (\n%s)\n" % "".join(requires))
with open(os.path.join(proj, "go.sum"), "w") as f:
    f.writelines(sums)
with open(os.path.join(proj, "main.go"), "w") as f:
    f.write("package main\n\nimport (\n\t\"fmt\"\n\n%s)\n\nfunc main() {\n\t_ = []int{%s}\n\tfmt.Println(m%03d.Value)\n}\n"
            % ("".join('\t"%s"\n' % m for m in mods),
               ", ".join("m%03d.Value" % i for i in range(count)), count - 1))
