# pure packing: peak of pages touched by live blocks, per placement policy (one VA or one per stream)
import sys, bisect, collections
sys.path.insert(0, "/work/main/python")
from xlog_cuda import replay as R
P = 2 << 20
class VA:
    def __init__(s, size=1 << 40):
        s.starts=[0]; s.lens=[size]
    def fitting(s, n):
        return [(a,l) for a,l in zip(s.starts,s.lens) if l>=n]
    def take(s, a, n):
        i=bisect.bisect_right(s.starts,a)-1; st,l=s.starts[i],s.lens[i]
        assert st<=a and a+n<=st+l
        parts=[]
        if a>st: parts.append((st,a-st))
        if a+n<st+l: parts.append((a+n,st+l-a-n))
        del s.starts[i]; del s.lens[i]
        for j,(x,y) in enumerate(parts): s.starts.insert(i+j,x); s.lens.insert(i+j,y)
    def give(s, a, n):
        i=bisect.bisect_left(s.starts,a)
        if i>0 and s.starts[i-1]+s.lens[i-1]==a:
            i-=1; s.lens[i]+=n
        else:
            s.starts.insert(i,a); s.lens.insert(i,n)
        if i+1<len(s.starts) and s.starts[i]+s.lens[i]==s.starts[i+1]:
            s.lens[i]+=s.lens[i+1]; del s.starts[i+1]; del s.lens[i+1]
def pages(a,n): return range(a//P,(a+n-1)//P+1)
def run(t, policy, per_stream):
    vas=collections.defaultdict(VA); occ=collections.Counter(); touched=0; peak=0
    where={}
    base={}
    for op in t.ops:
        if op>=0:
            n=-(-t.sizes[op]//512)*512; st=t.block_stream[op] if per_stream else 0
            if st not in base: base[st]=len(base)<<40
            va=vas[st]
            a=policy(va,n,occ,base[st])
            va.take(a-base[st],n); where[op]=(a,n,st)
            for p in pages(a,n):
                if occ[p]==0: touched+=1
                occ[p]+=1
            peak=max(peak,touched)
        else:
            if ~op not in where: continue
            a,n,st=where.pop(~op)
            vas[st].give(a-base[st],n)
            for p in pages(a,n):
                occ[p]-=1
                if occ[p]==0: touched-=1; del occ[p]
    return peak
def cands(va,n):
    for a,l in va.fitting(n):
        yield a,l
def best_fit(va,n,occ,b):
    a,l=min(va.fitting(n),key=lambda x:(x[1],x[0])); return a+b
def first_fit(va,n,occ,b):
    return va.fitting(n)[0][0]+b
def missing(a,n,occ): return sum(1 for p in pages(a,n) if occ[p]==0)
def fewest(va,n,occ,b, k=10**9):
    best=None
    fl=sorted(va.fitting(n),key=lambda x:(x[1],x[0]))[:k]
    for a,l in fl:
        for x in (a,a+l-n):
            m=missing(x+b,n,occ)
            key=(m,l,x)
            if best is None or key<best[0]: best=(key,x+b)
    return best[1]
def fewest_aligned(va,n,occ,b):
    # also candidate positions at page boundaries inside each range
    best=None
    for a,l in va.fitting(n):
        xs={a,a+l-n}
        x=-(-(a+b)//P)*P-b
        if x+n<=a+l: xs.add(x)
        e=((a+l+b)//P)*P-b-n
        if e>=a: xs.add(e)
        for x in xs:
            m=missing(x+b,n,occ); key=(m,l,x)
            if best is None or key<best[0]: best=(key,x+b)
    return best[1]
pol={'best':best_fit,'first':first_fit,'fewest':fewest,'fewest16':lambda v,n,o,b:fewest(v,n,o,b,16),'fewest_al':fewest_aligned}
t=R.read_trace(sys.argv[1],scale=int(sys.argv[2]))
live=t.peak_live_bytes/P
for name in sys.argv[3].split(','):
    for ps in (False,True):
        pk=run(t,pol[name],ps)
        print(f"{name:10s} per_stream={ps}: peak pages {pk}  ratio {pk/live:.3f} (live {live:.2f})")

# xlog-like: hits (0 missing) in own stream's VA first (best fit among fully mapped), then others; misses: global fewest
def run_pref(t):
    vas=collections.defaultdict(VA); occ=collections.Counter(); touched=0; peak=0; where={}; base={}
    for st in range(len(t.streams)): base[st]=st<<40
    for op in t.ops:
        if op>=0:
            n=-(-t.sizes[op]//512)*512; st=t.block_stream[op]
            def hits(s):
                out=[]
                for a,l in vas[s].fitting(n):
                    for x in (a,a+l-n):
                        if missing(x+base[s],n,occ)==0: out.append((l,x+base[s],s)); break
                return out
            h=hits(st)
            if not h:
                for s in base:
                    if s!=st: h+=hits(s)
            if h:
                l,a,s=min(h)
            else:
                best=None
                for s in base:
                    for a0,l in vas[s].fitting(n):
                        for x in (a0,a0+l-n):
                            m=missing(x+base[s],n,occ); key=(m, s!=st, l, x)
                            if best is None or key<best[0]: best=(key,x+base[s],s)
                a,s=best[1],best[2]
            vas[s].take(a-base[s],n); where[op]=(a,n,s)
            for p in pages(a,n):
                if occ[p]==0: touched+=1
                occ[p]+=1
            peak=max(peak,touched)
        else:
            if ~op not in where: continue
            a,n,s=where.pop(~op); vas[s].give(a-base[s],n)
            for p in pages(a,n):
                occ[p]-=1
                if occ[p]==0: touched-=1; del occ[p]
    return peak
if len(sys.argv)>4:
    pk=run_pref(t); print(f"pref: peak pages {pk} ratio {pk/live:.3f}")
