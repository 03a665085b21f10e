package workspace

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"maps"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
)

const module = "github.com/ghcrsync/ghcrsync/"

// layers are the package graph (docs/architecture.md): a package imports only packages of its
// own layer or below. Every package of the module is listed: a new one takes a place here first.
var layers = [][]string{
	{ // 0: leaves, no ghcrsync import
		"internal/clock", "internal/answer", "internal/atomicfile", "internal/authdigest", "internal/diag", "internal/golden",
		"internal/holder", "internal/human", "internal/pin", "internal/progress", "internal/readlimit", "internal/redact",
		"internal/requests", "internal/taints", "internal/usage", "internal/release", "internal/window", "internal/maintenance", "internal/pool",
	},
	{ // 1: the model and the pure rules
		"state", "plan", "internal/probe", "internal/drain", "internal/config", "internal/credential", "internal/nodetemplate", "internal/registryauth", "internal/keyring",
		"internal/liveness", "internal/metrics", "internal/object", "internal/secretwrite",
	},
	{ // 2: adapters: one client each
		"internal/cluster", "internal/talos", "internal/lease", "state/kubestate", "internal/fanout", "internal/permission",
		"internal/admission",
	},
	{"internal/fleet", "internal/prover"},                                     // 3: the readers
	{"apply", "internal/fence", "internal/planning"},                          // 4: the operations
	{"internal/view"},                                                         // 5: rendering
	{"internal/workspace"},                                                    // 6: the composition root
	{"cmd/ghcrsync", "cmd/ghcrsync-release", "config/examples"},               // 7: commands
	{"internal/sandbox/...", "cmd/ghcrsync-sandbox", "test/...", "bench/..."}, // 8: test infrastructure
}

func layerOf(pkg string) int {
	for i, l := range layers {
		for _, p := range l {
			if p == pkg || (strings.HasSuffix(p, "/...") && strings.HasPrefix(pkg+"/", strings.TrimSuffix(p, "..."))) {
				return i
			}
		}
	}

	return -1
}

// source is one package's non-test files, parsed.
type source struct {
	files    []*ast.File
	imports  map[string]bool // ghcrsync packages, module-relative
	clientGo bool            // imports a package of k8s.io/client-go: a Kubernetes API client
	fset     *token.FileSet  // where the files are: the module's one file set
}

func parseModule(t *testing.T) map[string]*source {
	t.Helper()

	root := filepath.Join("..", "..")
	fset := token.NewFileSet()
	pkgs := map[string]*source{}

	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}

		if d.IsDir() {
			if n := d.Name(); path != root && (strings.HasPrefix(n, ".") || n == "testdata" || n == "node_modules") {
				return filepath.SkipDir
			}

			return nil
		}

		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}

		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}

		rel, _ := filepath.Rel(root, filepath.Dir(path))
		rel = filepath.ToSlash(rel)

		s := pkgs[rel]
		if s == nil {
			s = &source{imports: map[string]bool{}, fset: fset}
			pkgs[rel] = s
		}

		s.files = append(s.files, f)

		for _, imp := range f.Imports {
			p, _ := strconv.Unquote(imp.Path.Value)
			if strings.HasPrefix(p, module) {
				s.imports[strings.TrimPrefix(p, module)] = true
			}

			if strings.HasPrefix(p, "k8s.io/client-go/") {
				s.clientGo = true
			}
		}

		return nil
	})
	if err != nil {
		t.Fatal(err)
	}

	return pkgs
}

// operations are the packages that run the rotation on ports.
var operations = []string{"apply", "internal/fence"}

// clientPath is the way from pkg to a package that imports k8s.io/client-go (pkg first, the client's
// importer last), or nil when no such way exists: pkg reaches a Kubernetes API client only
// through it.
func clientPath(pkgs map[string]*source, pkg string) []string {
	seen := map[string]bool{}

	var walk func(p string) []string

	walk = func(p string) []string {
		s := pkgs[p]
		if s == nil || seen[p] {
			return nil
		}

		seen[p] = true

		if s.clientGo {
			return []string{p}
		}

		for _, imp := range slices.Sorted(maps.Keys(s.imports)) {
			if path := walk(imp); path != nil {
				return append([]string{p}, path...)
			}
		}

		return nil
	}

	return walk(pkg)
}

// apply and fence reach no Kubernetes adapter, nor any package that holds a Kubernetes API client:
// every read and write of theirs goes through a port the workspace wires, and every fast test can
// stand in for it.
func TestOperationsReachNoKubernetesClient(t *testing.T) {
	pkgs := parseModule(t)

	for _, op := range operations {
		if pkgs[op] == nil {
			t.Fatalf("package %s not found", op)
		}

		if path := clientPath(pkgs, op); path != nil {
			t.Errorf("%s reaches a Kubernetes API client: %s imports k8s.io/client-go; reach the cluster through a port, and take a Node's vocabulary from internal/object",
				strings.Join(path, " → "), path[len(path)-1])
		}
	}

	// The negative control: an operation importing the adapter, which imports client-go, is seen.
	adapter := map[string]*source{
		"apply":            {imports: map[string]bool{"plan": true, "internal/cluster": true}},
		"plan":             {imports: map[string]bool{}},
		"internal/cluster": {imports: map[string]bool{}, clientGo: true},
	}
	if path := clientPath(adapter, "apply"); len(path) != 2 || path[1] != "internal/cluster" {
		t.Fatalf("apply → internal/cluster → client-go was not seen: %v", path)
	}
}

// Every package has a layer, and imports nothing above its own: no back-arrows.
func TestPackageGraphHasNoBackArrows(t *testing.T) {
	pkgs := parseModule(t)
	if len(pkgs) < 30 {
		t.Fatalf("found %d packages: the walk did not start at the module root", len(pkgs))
	}

	var bad []string

	for pkg, s := range pkgs {
		from := layerOf(pkg)
		if from < 0 {
			bad = append(bad, pkg+": in no layer (add it to layers, and to docs/architecture.md)")

			continue
		}

		for imp := range s.imports {
			if to := layerOf(imp); to > from {
				bad = append(bad, pkg+" (layer "+strconv.Itoa(from)+") imports "+imp+" (layer "+strconv.Itoa(to)+")")
			}
		}
	}

	sort.Strings(bad)

	if len(bad) > 0 {
		t.Fatalf("the package graph has back-arrows:\n%s", strings.Join(bad, "\n"))
	}
}

// The negative control: the rule sees an arrow that points up.
func TestPackageGraphRuleSeesABackArrow(t *testing.T) {
	if from, to := layerOf("plan"), layerOf("internal/cluster"); !(to > from) {
		t.Fatalf("plan (layer %d) importing internal/cluster (layer %d) would not be flagged", from, to)
	}

	if layerOf("internal/sandbox/containerd") != layerOf("test/budget") || layerOf("internal/unknown") != -1 {
		t.Fatal("the layer table's patterns do not match as documented")
	}
}

// The composition root has no operation logic: of plan and planning it uses types and constants,
// never a function.
func TestWorkspaceOnlyWires(t *testing.T) {
	pkgs := parseModule(t)

	for _, c := range []struct {
		pkg, qualifier, name string
		calls                bool // only a call (qualifier.X(…)) is flagged
	}{
		{"internal/workspace", "plan", "", true},
		{"internal/workspace", "planning", "", true},
	} {
		s := pkgs[c.pkg]
		if s == nil {
			t.Fatalf("package %s not found", c.pkg)
		}

		for _, f := range s.files {
			ast.Inspect(f, func(n ast.Node) bool {
				var sel *ast.SelectorExpr

				if c.calls {
					call, ok := n.(*ast.CallExpr)
					if !ok {
						return true
					}

					if sel, ok = call.Fun.(*ast.SelectorExpr); !ok {
						return true
					}
				} else if s, ok := n.(*ast.SelectorExpr); ok {
					sel = s
				} else {
					return true
				}

				if id, ok := sel.X.(*ast.Ident); ok && id.Name == c.qualifier && (c.name == "" || sel.Sel.Name == c.name) {
					t.Errorf("%s uses %s.%s: %s", c.pkg, c.qualifier, sel.Sel.Name, map[bool]string{
						true: "the workspace wires; a decision belongs in an operation package", false: "reach the cluster through a port"}[c.calls])
				}

				return true
			})
		}
	}
}

// maxPortMethods bounds a port: the run's and the fence's interfaces are small, at the consumer.
const maxPortMethods = 5

// wideInterfaces are the interfaces of pkg with more than maxPortMethods methods, an embedded
// interface counted by its own methods (one of this module resolved in pkgs, the others as one).
func wideInterfaces(pkgs map[string]*source, pkg string) []string {
	var wide []string

	for _, f := range pkgs[pkg].files {
		ast.Inspect(f, func(n ast.Node) bool {
			ts, ok := n.(*ast.TypeSpec)
			if !ok {
				return true
			}

			if it, ok := ts.Type.(*ast.InterfaceType); ok {
				if n := methodCount(pkgs, pkg, f, it, 0); n > maxPortMethods {
					wide = append(wide, ts.Name.Name+" has "+strconv.Itoa(n)+" methods")
				}
			}

			return true
		})
	}

	return wide
}

// methodCount counts it's methods, those of its embedded interfaces included.
func methodCount(pkgs map[string]*source, pkg string, f *ast.File, it *ast.InterfaceType, depth int) int {
	n := 0

	for _, m := range it.Methods.List {
		switch t := m.Type.(type) {
		case *ast.FuncType:
			n += max(len(m.Names), 1)
		case *ast.Ident: // an interface of the same package
			n += embedded(pkgs, pkg, t.Name, depth)
		case *ast.SelectorExpr: // another package's
			x, _ := t.X.(*ast.Ident)
			n += embedded(pkgs, importedAs(f, x), t.Sel.Name, depth)
		default:
			n++
		}
	}

	return n
}

// embedded counts the methods of interface name of package pkg (1 when it is not this module's).
func embedded(pkgs map[string]*source, pkg, name string, depth int) int {
	s := pkgs[pkg]
	if s == nil || depth > 5 {
		return 1
	}

	for _, f := range s.files {
		for _, d := range f.Decls {
			g, ok := d.(*ast.GenDecl)
			if !ok {
				continue
			}

			for _, spec := range g.Specs {
				if ts, ok := spec.(*ast.TypeSpec); ok && ts.Name.Name == name {
					if it, ok := ts.Type.(*ast.InterfaceType); ok {
						return methodCount(pkgs, pkg, f, it, depth+1)
					}
				}
			}
		}
	}

	return 1
}

// importedAs is the module-relative package the file imports as x ("" when not this module's).
func importedAs(f *ast.File, x *ast.Ident) string {
	if x == nil {
		return ""
	}

	for _, imp := range f.Imports {
		p, _ := strconv.Unquote(imp.Path.Value)
		name := p[strings.LastIndex(p, "/")+1:]

		if imp.Name != nil {
			name = imp.Name.Name
		}

		if name == x.Name && strings.HasPrefix(p, module) {
			return strings.TrimPrefix(p, module)
		}
	}

	return ""
}

// apply's and fence's ports are interfaces of at most maxPortMethods methods each.
func TestPortsAreSmall(t *testing.T) {
	pkgs := parseModule(t)

	for _, pkg := range []string{"apply", "internal/fence"} {
		s := pkgs[pkg]
		if s == nil {
			t.Fatalf("package %s not found", pkg)
		}

		if wide := wideInterfaces(pkgs, pkg); len(wide) > 0 {
			t.Errorf("%s: ports of more than %d methods: %s (split them by what the consumer asks)",
				pkg, maxPortMethods, strings.Join(wide, "; "))
		}
	}

	// The negative control: a six-method interface is flagged, and one that reaches six by
	// embedding another; a two-method one is not.
	control := map[string]*source{"p": {files: []*ast.File{mustParse(t, "package p\ntype Wide interface{ A(); B(); C(); D(); E(); F() }\n"+
		"type Small interface{ A(); B() }\ntype Four interface{ A(); B(); C(); D() }\ntype Embeds interface{ Four; E(); F() }\n")}}}
	if got := wideInterfaces(control, "p"); len(got) != 2 || !strings.HasPrefix(got[0], "Wide has 6") || !strings.HasPrefix(got[1], "Embeds has 6") {
		t.Fatalf("the rule does not see a six-method interface, plain or embedding: %v", got)
	}
}

func mustParse(t *testing.T, src string) *ast.File {
	t.Helper()

	f, err := parser.ParseFile(token.NewFileSet(), "p.go", src, parser.SkipObjectResolution)
	if err != nil {
		t.Fatal(err)
	}

	return f
}
